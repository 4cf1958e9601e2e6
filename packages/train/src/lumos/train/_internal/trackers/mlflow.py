"""MLflow for Train: a driver-side ``MLflowLoggerCallback`` and the rank-0 ``setup_mlflow``."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import Any

from lumos.storage import Checkpoint
from lumos.train._internal.callback import Callback
from lumos.train._internal.extras import require_extra
from lumos.train._internal.result import Result
from lumos.train._internal.trackers import common

log = logging.getLogger("lumos.train")

mlflow = require_extra("mlflow", "mlflow", "lumos.train.integrations.mlflow")
_entities = require_extra("mlflow.entities", "mlflow", "lumos.train.integrations.mlflow", "mlflow")


SEND_TIMEOUT_S = 600.0
"""How long ``on_finish`` waits for metrics still queued for the tracking server."""


def _experiment_id(
    client: Any, name: str | None, create: bool = True, artifact_location: str | None = None
) -> str:
    """``name``'s experiment (``MLFLOW_EXPERIMENT_NAME``, else ``MLFLOW_EXPERIMENT_ID``,
    else MLflow's ``Default``), created when missing and ``create``."""
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name is None and os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return str(client.get_experiment(os.environ["MLFLOW_EXPERIMENT_ID"]).experiment_id)
    name = name or "Default"
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    if not create:
        raise ValueError(
            f"MLflow experiment_name={name!r} does not exist; create it, or pass "
            "create_experiment_if_not_exists=True"
        )
    return str(client.create_experiment(name, artifact_location=artifact_location))


class _Sender:
    """Sends metric rows and tags to one MLflow run from a daemon thread: the reports that
    arrived while a call was in flight go in the next call (a tracking server's round trip,
    or a sqlite commit, costs milliseconds; the controller's thread does not wait for it)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self._client, self._run_id = client, run_id
        self._metrics: list[Any] = []
        self._tags: dict[str, str] = {}
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="lumos-mlflow", daemon=True)
        self._thread.start()

    def add(self, metrics: list[Any], tags: dict[str, str]) -> None:
        with self._wake:
            self._metrics += metrics
            self._tags.update(tags)
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closing or self._metrics or self._tags)
                metrics, self._metrics = self._metrics, []
                tags, self._tags = self._tags, {}
            if not metrics and not tags:
                return  # closing, all sent
            try:
                batch_tags = [_entities.RunTag(k, v) for k, v in tags.items()]
                for at in range(0, max(len(metrics), 1), 1000):  # MLflow's limit a call
                    chunk = metrics[at : at + 1000]
                    self._client.log_batch(self._run_id, metrics=chunk, tags=batch_tags)
                    batch_tags = []
            except Exception:
                log.exception("MLflowLoggerCallback: logging to run %s failed", self._run_id)

    def close(self, timeout_s: float) -> None:
        """Send what is queued (waiting at most ``timeout_s``) and stop."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("MLflowLoggerCallback: metrics not sent after %ss, dropped", timeout_s)


class MLflowLoggerCallback(Callback):
    """Logs a Train run to MLflow from the driver: ``train_loop_config`` as params, every
    report of rank 0 as metrics (step: the report's number in this ``fit()``, from 1), each
    committed checkpoint's path as a tag (``checkpoint`` for the latest, and
    ``checkpoint/<name>`` for each), and the end status: ``FINISHED``, ``FAILED`` or
    ``KILLED`` (Ctrl-C, SIGTERM). Each ``fit()`` (a resume too) is one MLflow run, named
    after the Train run and tagged ``lumos.run_path``. Needs
    ``pip install 'lumos-train[mlflow]'``.

    Args:
        tracking_uri: Where runs go (``http://...``, ``sqlite:///mlflow.db``, ...); default:
            ``MLFLOW_TRACKING_URI`` or MLflow's default.
        registry_uri: MLflow's model registry URI.
        experiment_name: MLflow experiment, created if missing; default:
            ``MLFLOW_EXPERIMENT_NAME``, else ``MLFLOW_EXPERIMENT_ID``, else ``Default``.
        tags: Tags set on the run.
        tracking_token: Sets ``MLFLOW_TRACKING_TOKEN``.
        save_artifact: Also upload each committed checkpoint's files as artifacts
            (``checkpoints/<name>/``).

    Example:
        >>> from lumos.train.integrations.mlflow import MLflowLoggerCallback
        >>> RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db",
        ...                                           experiment_name="resnet")])
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
    ) -> None:
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.run_id: str | None = None
        """The MLflow run of the latest ``fit()``."""
        self._client: Any = None
        self._sender: _Sender | None = None
        self._step = 0

    def on_start(self, run_name: str, run_path: str, config: dict[str, Any] | None) -> None:
        if self.tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        self._client = mlflow.MlflowClient(self.tracking_uri, self.registry_uri)
        tags = {**self.tags, "lumos.run_path": run_path}
        run = self._client.create_run(
            _experiment_id(self._client, self.experiment_name),
            run_name=run_name,
            tags={k: str(v) for k, v in tags.items()},
        )
        self.run_id = run.info.run_id
        self._step = 0
        params = [_entities.Param(k, str(v)[:6000]) for k, v in common.flat(config or {}).items()]
        for at in range(0, len(params), 100):  # at most 100 params a call
            self._client.log_batch(self.run_id, params=params[at : at + 100])
        self._sender = _Sender(self._client, self.run_id)

    def on_report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        self._step += 1
        now = int(time.time() * 1000)
        batch = [
            _entities.Metric(k, v, now, self._step) for k, v in common.scalars(metrics).items()
        ]
        tags = {}
        if checkpoint is not None:
            name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
            tags = {"checkpoint": checkpoint.uri, f"checkpoint/{name}": checkpoint.uri}
            if self.save_artifact:
                local, temporary = common.local_dir(checkpoint)
                self._client.log_artifacts(self.run_id, local, f"checkpoints/{name}")
                if temporary:
                    shutil.rmtree(local, ignore_errors=True)
        assert self._sender is not None
        self._sender.add(batch, tags)

    def on_restart(self, attempt: int, checkpoint: Checkpoint | None) -> None:
        assert self._sender is not None
        self._sender.add([], {"attempt": str(attempt)})

    def on_finish(self, result: Result | None, error: BaseException | None) -> None:
        if self.run_id is None:
            return
        if self._sender is not None:
            self._sender.close(SEND_TIMEOUT_S)
            self._sender = None
        if error is not None:
            self._client.set_tag(self.run_id, "error", f"{type(error).__name__}: {error}"[:5000])
        self._client.set_terminated(self.run_id, common.end_status(error))


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> Any:
    """Start an MLflow run in the training function and return the ``mlflow`` module to log
    with (as Ray's ``setup_mlflow``). Only rank 0 logs by default; the other ranks get an
    object whose every call does nothing.

    Args:
        config: Logged as the run's params (flattened: ``model/width``).
        tracking_uri: The tracking server or store.
        registry_uri: MLflow's model registry URI.
        experiment_id: An existing experiment's id (wins over ``experiment_name``).
        experiment_name: The experiment; default ``MLFLOW_EXPERIMENT_NAME``, else
            ``MLFLOW_EXPERIMENT_ID``, else ``Default``.
        tracking_token: Sets ``MLFLOW_TRACKING_TOKEN``.
        artifact_location: Where a newly created experiment keeps artifacts.
        run_name: Default: the Train run's name.
        create_experiment_if_not_exists: Create ``experiment_name`` when missing (else
            a missing experiment is a ``ValueError``).
        tags: Tags of the run.
        rank_zero_only: Log on rank 0 only.

    Returns:
        ``mlflow`` with an active run, or a no-op stand-in on the other ranks.

    Example:
        >>> def train_fn(config):
        ...     mlflow = setup_mlflow(config, tracking_uri="sqlite:///mlflow.db")
        ...     mlflow.log_metric("loss", 0.5, step=1)
    """
    if not common.rank_zero(rank_zero_only):
        return common.NoopModule()
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri:
        mlflow.set_registry_uri(registry_uri)
    client = mlflow.MlflowClient()
    if experiment_id is None:
        experiment_id = _experiment_id(
            client, experiment_name, create_experiment_if_not_exists, artifact_location
        )
    mlflow.start_run(
        experiment_id=experiment_id, run_name=run_name or common.run_name_default(), tags=tags
    )
    params = common.flat(config or {})
    if params:
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
    return mlflow
