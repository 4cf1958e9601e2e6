"""Driver-side callbacks, and the CSV / JSON / TensorBoard loggers built on them."""

from __future__ import annotations

import csv
import inspect
import io
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage import (
    AppendOnlyFile,
    Checkpoint,
    StorageIOError,
    is_local,
    resolve_filesystem,
    retried_put_file,
    retried_write,
)
from lumos.tune._internal.journal import dumps
from lumos.tune._internal.trial import Trial

logger = logging.getLogger("lumos.tune")


class Callback:
    """Hooks the driver calls as trials progress (override what you need).

    Callbacks run in the driver process, in the driver's loop: keep them quick. Each
    hook gets a frozen :class:`~lumos.tune.Trial` snapshot taken when it is called
    (changing it is an error, and it does not change as the trial goes on).

    Example:
        >>> class PrintBest(tune.Callback):
        ...     def on_trial_complete(self, trial):
        ...         print(trial.trial_name, trial.last_result.get("loss"))
        >>> tune.RunConfig(callbacks=[PrintBest()])
    """

    def setup(self, experiment_path: str, filesystem: AbstractFileSystem) -> None:
        """Called once before the first trial starts.

        Args:
            experiment_path: URL / local path of the experiment directory.
            filesystem: The experiment's fsspec filesystem.
        """

    def on_trial_start(self, trial: Trial) -> None:
        """A trial (or a retry of it) was launched."""

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        """A trial reported ``result`` (``trial.last_result`` is already updated)."""

    def on_trial_complete(self, trial: Trial) -> None:
        """A trial ended as TERMINATED or PRUNED."""

    def on_trial_error(self, trial: Trial) -> None:
        """A trial failed for good (after its retries); ``trial.error`` holds the error."""

    def on_experiment_end(self, trials: list[Trial]) -> None:
        """Called once after the last trial ended."""

    def on_checkpoint(self, trial: Trial, checkpoint: Checkpoint) -> None:
        """A trial's report committed ``checkpoint`` (``trial.checkpoint_dir`` names it)."""


# Ray's hook signatures: a hook whose first parameter is ``iteration`` (Ray's
# ``on_trial_result(self, iteration, trials, trial, result, **info)``) is called Ray's way,
# with ``trials`` a lazy sequence of snapshots; otherwise lumos's (``on_trial_result(trial,
# result)``). ``setup`` likewise: Ray's takes ``stop``, ``num_samples``, ... as keywords.
_RAY_STYLE: dict[tuple[type, str], bool] = {}


def _ray_style(cb: Callback, hook: str) -> bool:
    key = (type(cb), hook)
    style = _RAY_STYLE.get(key)
    if style is None:
        try:
            params = list(inspect.signature(getattr(cb, hook)).parameters)
        except (TypeError, ValueError):
            params = []
        first = params[0] if params else ""
        style = first == "iteration" if hook != "setup" else first not in ("experiment_path", "")
        _RAY_STYLE[key] = style
    return style


class Hooks:
    """Calls the callbacks' hooks, each in the style its override was written in
    (lumos's or Ray's, see :class:`Callback`), with the controller's loop ``iteration``.

    Args:
        callbacks: The user's callbacks.
        trials: Returns every trial so far, as snapshots (called only for Ray-style hooks,
            which get it as ``trials``).
    """

    def __init__(self, callbacks: list[Callback], trials: Callable[[], Sequence[Trial]]) -> None:
        self.callbacks = callbacks
        self._trials = trials
        self.iteration = 0

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def _each(self, hook: str, trial: Trial, *lumos_args: Any, **ray_kwargs: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook)
            if _ray_style(cb, hook):
                fn(iteration=self.iteration, trials=self._trials(), trial=trial, **ray_kwargs)
            else:
                fn(trial, *lumos_args)

    def trial_start(self, trial: Trial) -> None:
        """``on_trial_start``."""
        self._each("on_trial_start", trial)

    def trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        """``on_trial_result``."""
        self._each("on_trial_result", trial, result, result=result)

    def trial_end(self, trial: Trial, failed: bool) -> None:
        """``on_trial_error`` when ``failed``, else ``on_trial_complete``."""
        self._each("on_trial_error" if failed else "on_trial_complete", trial)

    def checkpoint(self, trial: Trial, checkpoint: Checkpoint) -> None:
        """``on_checkpoint``."""
        self._each("on_checkpoint", trial, checkpoint, checkpoint=checkpoint)


def setup_callbacks(
    callbacks: list[Callback],
    experiment_path: str,
    filesystem: AbstractFileSystem,
    stop: Any,
    num_samples: int,
    total_num_samples: int,
) -> None:
    """Call every callback's ``setup`` in its own style (lumos's or Ray's)."""
    for cb in callbacks:
        if _ray_style(cb, "setup"):
            cb.setup(  # type: ignore[call-arg]
                stop=stop,
                num_samples=num_samples,
                total_num_samples=total_num_samples,
                experiment_path=experiment_path,
                filesystem=filesystem,
            )
        else:
            cb.setup(experiment_path, filesystem)


class LoggerCallback(Callback):
    """Ray's base class for loggers: override ``log_trial_start``,
    ``log_trial_result`` and ``log_trial_end`` (``lumos.tune.logger.LoggerCallback``, as
    ``ray.tune.logger.LoggerCallback``).

    Example:
        >>> class PrintLogger(LoggerCallback):
        ...     def log_trial_result(self, iteration, trial, result):
        ...         print(trial.trial_name, result["loss"])
        >>> tune.RunConfig(callbacks=[PrintLogger()])
    """

    def log_trial_start(self, trial: Trial) -> None:
        """A trial (or a retry of it) started."""

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """A trial reported ``result``; ``iteration`` is the driver loop's."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """A trial ended; ``failed``: it ended in ERROR."""

    def on_trial_start(  # type: ignore[override]
        self, iteration: int, trials: Sequence[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_start(trial)

    def on_trial_result(  # type: ignore[override]
        self,
        iteration: int,
        trials: Sequence[Trial],
        trial: Trial,
        result: dict[str, Any],
        **info: Any,
    ) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_trial_complete(  # type: ignore[override]
        self, iteration: int, trials: Sequence[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(  # type: ignore[override]
        self, iteration: int, trials: Sequence[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=True)


class _TrialFileLogger(Callback):
    """Writes one file per trial into its directory.

    On a local filesystem the file is appended as results arrive; on other
    filesystems (no append) it is written once when the trial ends. Writes are
    retried (lumos-storage's policy) and best effort: one that fails for good is
    logged as a warning, and the sweep goes on.
    """

    filename = ""

    def __init__(self) -> None:
        self._fs: AbstractFileSystem | None = None
        self._files: dict[str, AppendOnlyFile] = {}
        self._buffers: dict[str, io.StringIO] = {}

    def setup(self, experiment_path: str, filesystem: AbstractFileSystem) -> None:
        self._fs = filesystem

    def _path(self, trial: Trial) -> str:
        return trial.path.rstrip("/") + "/" + self.filename

    def _write(self, trial: Trial, text: str) -> None:
        """Append ``text`` to the trial's file (local) or to its buffer (elsewhere)."""
        key = trial.trial_name
        if self._fs is None:
            self._fs, _ = resolve_filesystem(trial.path)
        if not is_local(self._fs):
            self._buffers.setdefault(key, io.StringIO()).write(text)
            return
        f = self._files.get(key)
        if f is None:
            f = self._files[key] = AppendOnlyFile(self._path(trial))
        try:
            f.append(text.encode("utf-8"))
        except StorageIOError as exc:
            logger.warning("%s: result not logged: %s", type(self).__name__, exc)

    def _close(self, trial: Trial) -> None:
        f = self._files.pop(trial.trial_name, None)
        buf = self._buffers.pop(trial.trial_name, None)
        try:
            if f is not None:
                f.close()
            if buf is not None and self._fs is not None:
                retried_write(self._fs, self._path(trial), buf.getvalue().encode("utf-8"))
        except StorageIOError as exc:
            logger.warning("%s: %s not written: %s", type(self).__name__, self.filename, exc)

    def on_trial_complete(self, trial: Trial) -> None:
        self._close(trial)

    def on_trial_error(self, trial: Trial) -> None:
        self._close(trial)

    def on_experiment_end(self, trials: list[Trial]) -> None:
        for trial in trials:
            if trial.trial_name in self._files or trial.trial_name in self._buffers:
                self._close(trial)


class JSONLoggerCallback(_TrialFileLogger):
    """Writes every result of a trial as a JSON line to ``<trial dir>/result.json``.

    Example:
        >>> tune.RunConfig(callbacks=[tune.JSONLoggerCallback()])
    """

    filename = "result.json"

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        self._write(trial, dumps(result) + "\n")


class CSVLoggerCallback(_TrialFileLogger):
    """Writes every result of a trial as a CSV row to ``<trial dir>/progress.csv``.

    The header is the first result's keys; later new keys are dropped from the CSV
    (they stay in ``Result.metrics_dataframe``).

    Example:
        >>> tune.RunConfig(callbacks=[tune.CSVLoggerCallback()])
    """

    filename = "progress.csv"

    def __init__(self) -> None:
        super().__init__()
        self._fields: dict[str, list[str]] = {}

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        stream = io.StringIO()
        fields = self._fields.get(trial.trial_name)
        writer_header = False
        if fields is None:
            fields = self._fields[trial.trial_name] = list(result)
            writer_header = True
        writer = csv.DictWriter(stream, fieldnames=fields, extrasaction="ignore")
        if writer_header:
            writer.writeheader()
        writer.writerow({k: result.get(k, "") for k in fields})
        self._write(trial, stream.getvalue())

    def _close(self, trial: Trial) -> None:
        self._fields.pop(trial.trial_name, None)
        super()._close(trial)


class TBXLoggerCallback(Callback):
    """Writes numeric results to TensorBoard event files in each trial's directory.

    Needs ``tensorboardX`` (``pip install "lumos-tune[tensorboard]"``). On
    non-local storage the event files are written locally and uploaded when the
    trial ends.

    Example:
        >>> tune.RunConfig(callbacks=[tune.TBXLoggerCallback()])
    """

    def __init__(self) -> None:
        try:
            import tensorboardX
        except ImportError as exc:
            raise ImportError(
                "TBXLoggerCallback needs tensorboardX: pip install 'lumos-tune[tensorboard]' "
                "(or pip install tensorboardX)"
            ) from exc
        self._tbx = tensorboardX
        self._fs: AbstractFileSystem | None = None
        self._writers: dict[str, tuple[Any, str]] = {}

    def setup(self, experiment_path: str, filesystem: AbstractFileSystem) -> None:
        self._fs = filesystem

    def _writer(self, trial: Trial) -> Any:
        entry = self._writers.get(trial.trial_name)
        if entry is None:
            if self._fs is None:
                self._fs, _ = resolve_filesystem(trial.path)
            logdir = trial.path if is_local(self._fs) else tempfile.mkdtemp(prefix="lumos-tbx-")
            writer = self._tbx.SummaryWriter(logdir=logdir, flush_secs=30)
            entry = self._writers[trial.trial_name] = (writer, logdir)
        return entry[0]

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        writer = self._writer(trial)
        step = int(result.get("training_iteration", trial.iteration))
        for key, value in result.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(key, value, global_step=step)

    def _close(self, trial: Trial) -> None:
        entry = self._writers.pop(trial.trial_name, None)
        if entry is None:
            return
        writer, logdir = entry
        writer.close()
        if self._fs is not None and not is_local(self._fs):
            for name in os.listdir(logdir):
                target = trial.path.rstrip("/") + "/" + name
                try:
                    retried_put_file(self._fs, os.path.join(logdir, name), target)
                except StorageIOError as exc:
                    logger.warning("TBXLoggerCallback: %s not uploaded: %s", name, exc)

    def on_trial_complete(self, trial: Trial) -> None:
        self._close(trial)

    def on_trial_error(self, trial: Trial) -> None:
        self._close(trial)

    def on_experiment_end(self, trials: list[Trial]) -> None:
        for name in list(self._writers):
            for trial in trials:
                if trial.trial_name == name:
                    self._close(trial)
