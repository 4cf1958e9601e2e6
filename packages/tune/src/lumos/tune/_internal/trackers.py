"""MLflow and Weights & Biases loggers: one tracker run per trial (Ray's
``ray.air.integrations.mlflow`` / ``.wandb`` callbacks, same names and arguments).

The driver handles thousands of trials, so a logger only queues its work: one
background thread per logger talks to the tracker, in the order things happened.
Per result the driver flattens the result, keeps the numbers and enqueues them.
``on_experiment_end`` waits (bounded) for the queue to drain.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import queue
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage import Checkpoint, is_local, resolve_filesystem, retried_download
from lumos.tune._internal.callbacks import LoggerCallback
from lumos.tune._internal.metrics import flatten
from lumos.tune._internal.trial import Trial, TrialStatus

log = logging.getLogger("lumos.tune")

DEFAULT_SYNC_TIMEOUT = 1800
"""Seconds ``on_experiment_end`` waits for queued tracker work (Ray's default)."""

_WANDB_DROP = ("done", "should_checkpoint")
"""Result keys Ray's W&B logger never logs."""


def import_tracker(module: str, extra: str) -> Any:
    """``module``, or an ImportError naming the ``lumos-tune[extra]`` extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module} is not installed: pip install 'lumos-tune[{extra}]' (or pip install {extra})"
        ) from exc


def _numbers(result: dict[str, Any], skip: Callable[[str], bool]) -> dict[str, float]:
    """The finite numbers of a flattened ``result`` (bools and ``skip``ped keys left out)."""
    out: dict[str, float] = {}
    for key, value in flatten(result).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or skip(key):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def _step(trial: Trial, result: dict[str, Any]) -> int:
    """Ray's step: ``timesteps_total`` when reported, else ``training_iteration``."""
    return int(result.get("timesteps_total") or result.get("training_iteration", trial.iteration))


def _local_copy(path: str) -> tuple[str, bool]:
    """``path`` as a local directory: itself when local, else a downloaded temporary copy
    (second item: whether it is temporary)."""
    fs, fs_path = resolve_filesystem(path)
    if is_local(fs):
        return fs_path, False
    dest = tempfile.mkdtemp(prefix="lumos-tracker-")
    retried_download(fs, fs_path.rstrip("/"), dest)
    return dest, True


class _Queue:
    """A daemon thread running queued calls in order; a failed call is logged and dropped."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def put(self, call: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put(call)

    def _loop(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            try:
                call()
            except Exception:
                log.exception("%s: a tracker call failed; continuing", self._name)

    def close(self, timeout_s: float) -> None:
        """Run what is queued (waiting at most ``timeout_s``), then stop the thread."""
        if self._thread is None:
            return
        self._calls.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("%s: tracker calls still pending after %ss; dropped", self._name, timeout_s)
        self._thread = None


class MLflowLoggerCallback(LoggerCallback):
    """Logs each trial as an MLflow run: its config as params, each result's numbers as
    metrics (with the step), and its end status (``lumos.tune.logger.MLflowLoggerCallback``,
    as Ray's ``ray.air.integrations.mlflow.MLflowLoggerCallback``).

    Runs are named after the trials and tagged ``trial_name``, ``trial_id`` and, when the
    trial ends, ``trial_status`` (``TERMINATED``, ``PRUNED`` or ``ERROR``). A trial that
    errored ends ``FAILED``, one still running when the experiment stops ``KILLED``, the
    others ``FINISHED``. The MLflow calls run in a background thread of the driver. Needs
    ``pip install 'lumos-tune[mlflow]'``.

    Args:
        tracking_uri: Where runs go (``http://...``, ``sqlite:///mlflow.db``, ...); default:
            ``MLFLOW_TRACKING_URI`` or MLflow's default.
        registry_uri: MLflow's model registry URI.
        experiment_name: MLflow experiment, created if missing; default:
            ``MLFLOW_EXPERIMENT_NAME``, else ``MLFLOW_EXPERIMENT_ID``, else the Tune
            experiment's name.
        tags: Tags set on every run.
        tracking_token: Sets ``MLFLOW_TRACKING_TOKEN``.
        save_artifact: Upload each trial's directory as the run's artifacts when it ends.
        log_params_on_trial_end: Log the params when the trial ends, not when it starts.

    Example:
        >>> from lumos.tune.logger import MLflowLoggerCallback
        >>> tune.RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db",
        ...                                                 experiment_name="sweep-7")])
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
    ) -> None:
        self._mlflow = import_tracker("mlflow", "mlflow")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self._client: Any = None
        self.experiment_id: str | None = None
        self._queue = _Queue("lumos-mlflow")
        self._open: set[str] = set()  # trials with a run not ended yet (driver side)
        self._run_ids: dict[str, str] = {}  # trial_id -> MLflow run id (written by the thread)
        # trial_id -> metric rows not sent yet: the thread sends each trial's rows in one
        # call, however many results arrived while it was busy
        self._pending: dict[str, list[tuple[str, float, int, int]]] = {}
        self._lock = threading.Lock()

    def setup(self, experiment_path: str, filesystem: AbstractFileSystem) -> None:
        """Connect to the tracking server and find or create the experiment (raises here,
        before any trial starts, when the server or experiment is unusable)."""
        if self.tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        tracking = importlib.import_module("mlflow.tracking")
        self._client = tracking.MlflowClient(self.tracking_uri, self.registry_uri)
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        env_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if name is None and env_id:
            self.experiment_id = self._client.get_experiment(env_id).experiment_id
            return
        name = name or experiment_path.rstrip("/").rsplit("/", 1)[-1]
        found = self._client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found else self._client.create_experiment(name)

    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self._open or trial.trial_id in self._run_ids:
            return  # a retry: same run
        self._open.add(trial.trial_id)
        tags = {**self.tags, "trial_name": trial.trial_name, "trial_id": trial.trial_id}
        params = None if self.log_params_on_trial_end else trial.config
        self._queue.put(lambda: self._start(trial.trial_id, trial.trial_name, tags, params))

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._open:
            self.log_trial_start(trial)
        metrics = _numbers(result, lambda key: key.startswith("config/"))
        step, now_ms = _step(trial, result), int(time.time() * 1000)
        with self._lock:
            rows = self._pending.setdefault(trial.trial_id, [])
            first = not rows
            rows.extend((key, value, now_ms, step) for key, value in metrics.items())
        if first:
            self._queue.put(lambda: self._send(trial.trial_id))

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._end(trial, "FAILED" if failed else "FINISHED")

    def on_experiment_end(self, trials: list[Trial]) -> None:
        for trial in trials:
            if trial.trial_id in self._open:
                self._end(trial, "KILLED")
        self._queue.close(DEFAULT_SYNC_TIMEOUT)

    def _end(self, trial: Trial, status: str) -> None:
        if trial.trial_id not in self._open:
            return
        self._open.discard(trial.trial_id)
        params = trial.config if self.log_params_on_trial_end else None
        artifacts = trial.path if self.should_save_artifact else None
        trial_status = trial.status.value if trial.status.is_finished else "RUNNING"
        self._queue.put(
            lambda: self._finish(trial.trial_id, status, trial_status, params, artifacts)
        )

    # -- in the background thread ---------------------------------------------------------
    def _start(
        self, trial_id: str, name: str, tags: dict[str, Any], params: dict[str, Any] | None
    ) -> None:
        tags = {key: str(value) for key, value in tags.items()}
        run = self._client.create_run(self.experiment_id, run_name=name, tags=tags)
        self._run_ids[trial_id] = run.info.run_id
        if params is not None:
            self._params(run.info.run_id, params)

    def _params(self, run_id: str, config: dict[str, Any]) -> None:
        entities = importlib.import_module("mlflow.entities")
        params = [entities.Param(_key(k), str(v)[:6000]) for k, v in flatten(config).items()]
        for at in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self._client.log_batch(run_id, params=params[at : at + 100])

    def _send(self, trial_id: str) -> None:
        with self._lock:
            rows = self._pending.pop(trial_id, [])
        run_id = self._run_ids.get(trial_id)
        if run_id is None:  # creating the run failed (logged)
            return
        entities = importlib.import_module("mlflow.entities")
        batch = [entities.Metric(_key(k), v, ms, step) for k, v, ms, step in rows]
        for at in range(0, len(batch), 1000):  # MLflow's limit per batch
            self._client.log_batch(run_id, metrics=batch[at : at + 1000])

    def _finish(
        self,
        trial_id: str,
        status: str,
        trial_status: str,
        params: dict[str, Any] | None,
        artifacts: str | None,
    ) -> None:
        run_id = self._run_ids.get(trial_id)
        if run_id is None:  # creating the run failed (logged)
            return
        if params is not None:
            self._params(run_id, params)
        self._client.set_tag(run_id, "trial_status", trial_status)
        if artifacts is not None:
            local, temporary = _local_copy(artifacts)
            self._client.log_artifacts(run_id, local)
            if temporary:
                shutil.rmtree(local, ignore_errors=True)
        self._client.set_terminated(run_id, status)


_BAD_KEY = re.compile(r"[^\w./\- ]")


def _key(name: str) -> str:
    """An MLflow-valid key (letters, digits, ``_ - . / `` and space; others become ``_``)."""
    return _BAD_KEY.sub("_", name)


class WandbLoggerCallback(LoggerCallback):
    """Logs each trial as a Weights & Biases run: its config, each result's numbers (step:
    ``training_iteration``), optionally its checkpoints as artifacts, and its exit code
    (``lumos.tune.logger.WandbLoggerCallback``, as Ray's
    ``ray.air.integrations.wandb.WandbLoggerCallback``).

    Runs are named after the trials and grouped by ``group`` (default: the experiment's
    name). Ray logs from one actor per trial; here one background thread of the driver
    holds every open run (``wandb.init(reinit="create_new")``), so a sweep of thousands
    of trials starts no process per trial. Set ``WANDB_MODE=offline`` to log without a
    network. Needs ``pip install 'lumos-tune[wandb]'``.

    Args:
        project: W&B project; default ``WANDB_PROJECT`` (one of them is required).
        group: W&B group; default ``WANDB_GROUP``, else the Tune experiment's name.
        api_key_file: A file holding the API key (sets ``WANDB_API_KEY``).
        api_key: The API key (sets ``WANDB_API_KEY``).
        excludes: Result and config keys (or ``/``-joined prefixes) not to log.
        log_config: Also log the ``config`` entries of each result.
        upload_checkpoints: Log each committed checkpoint as a ``model`` artifact.
        save_checkpoints: Deprecated spelling of ``upload_checkpoints``.
        upload_timeout: Seconds ``on_experiment_end`` waits for the runs to finish.
        **kwargs: More ``wandb.init`` arguments (``entity``, ``tags``, ``mode``, ...).

    Example:
        >>> from lumos.tune.logger import WandbLoggerCallback
        >>> tune.RunConfig(callbacks=[WandbLoggerCallback(project="sweeps")])
    """

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: int = DEFAULT_SYNC_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        self._wandb = import_tracker("wandb", "wandb")
        if save_checkpoints:
            warnings.warn(
                "WandbLoggerCallback(save_checkpoints=...) is deprecated: use upload_checkpoints",
                DeprecationWarning,
                stacklevel=2,
            )
            upload_checkpoints = True
        if api_key and api_key_file:
            raise ValueError(
                "WandbLoggerCallback: pass api_key or api_key_file, not both "
                f"(api_key_file={api_key_file!r})"
            )
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints
        self.upload_timeout = upload_timeout
        self.kwargs = kwargs
        self._queue = _Queue("lumos-wandb")
        self._open: set[str] = set()
        self._runs: dict[str, Any] = {}  # trial_id -> wandb Run (used by the thread only)

    def setup(self, experiment_path: str, filesystem: AbstractFileSystem) -> None:
        """Set the API key and resolve project and group (raises when no project is set)."""
        key = self.api_key
        if self.api_key_file:
            with open(os.path.expanduser(self.api_key_file), encoding="utf-8") as f:
                key = f.readline().strip()
        if key:
            os.environ["WANDB_API_KEY"] = key
        self.project = self.project or os.environ.get("WANDB_PROJECT")
        if not self.project:
            raise ValueError(
                "WandbLoggerCallback(project=None) and WANDB_PROJECT is not set: "
                "pass project='...' or set the WANDB_PROJECT environment variable"
            )
        default_group = experiment_path.rstrip("/").rsplit("/", 1)[-1]
        self.group = self.group or os.environ.get("WANDB_GROUP") or default_group

    def _excluded(self, key: str) -> bool:
        return any(key == e or key.startswith(e + "/") for e in self.excludes)

    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self._open:
            return
        self._open.add(trial.trial_id)
        config = {k: v for k, v in flatten(trial.config).items() if not self._excluded(k)}
        init = {
            "project": self.project,
            "group": self.group,
            "name": trial.trial_name,
            "config": config,
            "reinit": "create_new",
            "allow_val_change": True,
            **self.kwargs,
        }
        self._queue.put(lambda: self._runs.__setitem__(trial.trial_id, self._wandb.init(**init)))

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._open:
            self.log_trial_start(trial)

        def skip(key: str) -> bool:
            dropped = key in _WANDB_DROP or (not self.log_config and key.startswith("config/"))
            return dropped or self._excluded(key)

        metrics = _numbers(result, skip)
        step = _step(trial, result)
        self._queue.put(lambda: self._log(trial.trial_id, metrics, step))

    def on_checkpoint(self, trial: Trial, checkpoint: Checkpoint) -> None:
        if not self.upload_checkpoints or trial.trial_id not in self._open:
            return
        name = f"checkpoint_{trial.trial_name}"
        self._queue.put(lambda: self._upload(trial.trial_id, name, checkpoint.uri))

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        self._end(trial, 1 if failed else 0)

    def on_experiment_end(self, trials: list[Trial]) -> None:
        for trial in trials:
            self._end(trial, 130)  # still open: the experiment stopped (as Ctrl-C)
        self._queue.close(self.upload_timeout)

    def _end(self, trial: Trial, exit_code: int) -> None:
        if trial.trial_id not in self._open:
            return
        self._open.discard(trial.trial_id)
        status = trial.status if trial.status.is_finished else TrialStatus.RUNNING
        self._queue.put(lambda: self._finish(trial.trial_id, exit_code, status.value))

    # -- in the background thread ---------------------------------------------------------
    def _upload(self, trial_id: str, name: str, uri: str) -> None:
        local, temporary = _local_copy(uri)
        artifact = self._wandb.Artifact(name=name, type="model")
        artifact.add_dir(local)
        self._runs[trial_id].log_artifact(artifact)
        if temporary:
            shutil.rmtree(local, ignore_errors=True)

    def _log(self, trial_id: str, metrics: dict[str, float], step: int) -> None:
        run = self._runs.get(trial_id)
        if run is not None:  # else wandb.init failed (logged)
            run.log(metrics, step=step)

    def _finish(self, trial_id: str, exit_code: int, trial_status: str) -> None:
        run = self._runs.pop(trial_id, None)
        if run is None:
            return
        run.summary["trial_status"] = trial_status
        run.finish(exit_code=exit_code)
