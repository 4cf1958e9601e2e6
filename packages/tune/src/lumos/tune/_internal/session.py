"""Trial side: what runs in a trial's actor around the user's function.

The driver launches :class:`TrialRunner` (one object per sweep, so the user
function is shipped once) with a :class:`TrialSpec` per trial. The runner
opens a :class:`TrialSession`, publishes a ``lumos.runtime.context.JobContext``
for nested jobs (a Train run started in the trial), runs the function and tells
the driver how it ended.

``tune.report`` emits ``(iteration, metrics, checkpoint_dir)`` to the driver
without waiting for it. The driver answers a pruning or stop decision by
setting the session's stop flag; the trial's next ``tune.report`` then raises
``tune.TrialPruned``. When the driver judges every report (a pruner, a stopper),
the report asks for a verdict and the *next* report waits for it
(:meth:`TrialSession.settle`): the report that met a criterion is the trial's
last, as in Ray, while training still overlaps the driver's round trip.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from lumos.runtime import CurrentSlot, context as job_context, worker as runtime_worker
from lumos.storage import Checkpoint, CheckpointRecord, RunState, retried_rm, to_jsonable
from lumos.tune._internal.trial_spec import SweepInfo, TrialContext, TrialSpec

# How a trial function ended, as returned to the driver in FinishedEvent.result.
DONE = "done"
PRUNED = "pruned"
# The driver's answer to a report that waits for it (population-based training).
GO = "go"
STOP = "stop"

ITERATION_KEY = "training_iteration"


class SessionLike(Protocol):
    """The part of ``lumos.runtime.WorkerSession`` a trial uses."""

    def emit(self, payload: Any) -> None: ...

    def receive(self, timeout_s: float | None = None) -> Any: ...

    @property
    def stop_requested(self) -> bool: ...


class TrialSession:
    """One attempt of one trial on its actor (or in-process in tests)."""

    def __init__(
        self, spec: TrialSpec, sweep: SweepInfo, runtime_session: SessionLike, trial_uri: str
    ) -> None:
        self.spec = spec
        self.sweep = sweep
        self.context = TrialContext(spec, sweep, trial_uri)
        self._session = runtime_session
        self.iteration = spec.start_iteration
        self._checkpoint_dir = spec.checkpoint_dir
        self._state: RunState | None = None
        self._lock = threading.Lock()
        self.stop_event = _stop_event_for(runtime_session)
        self._last_look = spec.pbt_last_look
        self._reached_stop = False
        self._verdict_due = False  # the driver has yet to judge the previous report
        # Ray fills in time_total_s; lumos does when a stop bound asks for it.
        self._started = time.monotonic() if "time_total_s" in (sweep.stop or {}) else None

    # -- user API ----------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """The driver asked the trial to stop, or it reached a ``stop`` bound."""
        return self._reached_stop or self._session.stop_requested

    def report(
        self,
        metrics: Mapping[str, Any],
        checkpoint: Checkpoint | None = None,
        *,
        nested_checkpoint: str | None = None,
    ) -> None:
        """One report; ``nested_checkpoint``: the URL of a checkpoint a nested Train run
        committed with these metrics (see :meth:`report_nested`)."""
        if self.settle():
            self.stop_event.set()
            raise pruned_error(
                f"trial {self.spec.trial_name!r} was ended early by the driver "
                "(pruned or stop criteria met)"
            )
        if not isinstance(metrics, Mapping):
            raise _tune_type_error(
                f"tune.report(metrics=...) takes a dict, got {type(metrics).__name__}"
            )
        with self._lock:
            self.iteration += 1
            it = self.iteration
            row = dict(metrics)
            row[ITERATION_KEY] = it
            if self._started is not None:
                row.setdefault("time_total_s", time.monotonic() - self._started)
            dir_name = None
            if checkpoint is not None:
                dir_name = self._commit(checkpoint, row, it)
            elif nested_checkpoint is not None:
                dir_name = self._nested_dir(nested_checkpoint)
            self._reached_stop = self._reached_stop or _reaches(row, self.sweep.stop)
            look = self._look_due(row)  # population-based training waits for it here
            # Judged by the driver otherwise: the answer is read at the next report
            # (settle()), so training goes on meanwhile and this report may be the last.
            self._verdict_due = not look and self.sweep.judge_reports and not self._reached_stop
            awaiting = look or self._verdict_due
            self._session.emit((it, row, dir_name, True) if awaiting else (it, row, dir_name))
            if not look:
                return
            verdict = self._receive_verdict()  # the driver's answer (a stop wakes it too)
        if verdict != GO:
            self.stop_event.set()
            raise pruned_error(
                f"trial {self.spec.trial_name!r} was stopped by the driver "
                "(population-based training clones another trial into it)"
            )

    def settle(self) -> bool:
        """Whether the trial must stop, once the driver judged its previous report.

        With ``SweepInfo.judge_reports`` each report asks the driver for a verdict
        (a pruner's, a stopper's) without waiting for it; the next report, or a class
        ``Trainable`` right after its step's report, waits here for it. So a trial
        never runs past the report that ended it: that report is its last result.
        """
        if self._verdict_due:
            self._verdict_due = False
            if self._receive_verdict() != GO:
                self._reached_stop = True
        return self.should_stop

    def _receive_verdict(self) -> Any:
        try:
            return self._session.receive()
        except runtime_worker.StopRequested:
            return STOP

    def _look_due(self, row: dict[str, Any]) -> bool:
        """Whether population-based training looks at this report (then it waits)."""
        if self.sweep.pbt_look is None:
            return False
        time_attr, interval, burn_in = self.sweep.pbt_look
        value = row.get(time_attr)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < burn_in:
            return False
        if value - self._last_look < interval:
            return False
        self._last_look = float(value)
        return True

    def report_nested(self, metrics: dict[str, Any], checkpoint_url: str) -> None:
        """A nested Train run committed ``checkpoint_url`` with ``metrics`` (its
        ``JobContext.report_checkpoint``): the trial reports both, so the checkpoint is
        the trial's latest (``Result.checkpoint``, a retry's resume point, a PBT donor's)."""
        self.report(metrics, nested_checkpoint=checkpoint_url)

    def _nested_dir(self, url: str) -> str | None:
        """``url`` relative to the trial's directory (``train/checkpoint_000002``); None
        when the nested run writes elsewhere (the trial cannot name it then)."""
        base = self.context.get_trial_dir().rstrip("/") + "/"
        if not url.startswith(base):
            return None
        self._checkpoint_dir = url[len(base) :]
        return self._checkpoint_dir

    def get_checkpoint(self) -> Checkpoint | None:
        if self._checkpoint_dir is None:
            return None
        if "/" in self._checkpoint_dir:  # a nested run's checkpoint
            storage = self.context.get_storage()
            return Checkpoint(f"{self.context.get_trial_dir()}/{self._checkpoint_dir}", storage.fs)
        return self.context.get_storage().checkpoint(self._checkpoint_dir)

    # -- internals -----------------------------------------------------------------------
    def _commit(self, checkpoint: Checkpoint, metrics: dict[str, Any], iteration: int) -> str:
        if not isinstance(checkpoint, Checkpoint):
            raise _tune_type_error(
                f"tune.report(checkpoint=...) takes a tune.Checkpoint, got {type(checkpoint).__name__}"
            )
        storage = self.context.get_storage()
        dir_name = f"checkpoint_{iteration:06d}"
        if self.spec.attempt > 0:
            # An earlier attempt may have left an uncommitted upload under this name.
            retried_rm(storage.fs, storage.checkpoint_path(dir_name), recursive=True)
        with checkpoint.as_directory() as local_dir:
            storage.persist_directory(local_dir, dir_name)
        if self._state is None:
            self._state = storage.load_state() or RunState(name=self.spec.directory)
        record = CheckpointRecord(
            dir_name=dir_name,
            metrics=to_jsonable(metrics),
            report_index=iteration,
            created_at=time.time(),
        )
        self._state, _ = storage.commit_checkpoint(self._state, record, self.sweep.retention)
        self._checkpoint_dir = dir_name
        return dir_name

    def final_report(self, result: Any) -> None:
        """Treat a returned dict (or number, with a single metric) as a last report."""
        if isinstance(result, Mapping):
            metrics: Mapping[str, Any] = result
        elif (
            self.sweep.metric is not None
            and isinstance(result, (int, float))
            and not isinstance(result, bool)
        ):
            metrics = {self.sweep.metric: result}
        else:
            return
        try:
            self.report(metrics)
        except Exception as exc:
            if not is_pruned(exc) and not isinstance(exc, runtime_worker.StopRequested):
                raise


# lumos.tune's exceptions are imported on first use: ``TrialPruned`` subclasses
# ``optuna.TrialPruned``, and a trial's actor should not import optuna unless a trial is
# pruned or fails (it costs every fresh actor about 0.1 s of CPU).
def pruned_error(message: str) -> Exception:
    """A ``tune.TrialPruned`` with ``message``."""
    from lumos.tune._internal.errors import TrialPruned

    return TrialPruned(message)


def _tune_error(message: str) -> Exception:
    from lumos.tune._internal.errors import TuneError

    return TuneError(message)


def _tune_type_error(message: str) -> Exception:
    from lumos.tune._internal.errors import TuneTypeError

    return TuneTypeError(message)


def is_pruned(exc: BaseException) -> bool:
    """True for ``tune.TrialPruned`` and for an ``optuna.TrialPruned`` the user raised."""
    optuna_exceptions = sys.modules.get("optuna.exceptions")
    return optuna_exceptions is not None and isinstance(exc, optuna_exceptions.TrialPruned)


def _reaches(row: Mapping[str, Any], stop: Mapping[str, float] | None) -> bool:
    """Whether a report reaches a ``stop`` bound (the driver's ``StopRules`` rule)."""
    if not stop:
        return False
    for key, bound in stop.items():
        value = row.get(key)
        if isinstance(value, bool):
            value = int(value)  # Ray's stop={"done": True}
        if not isinstance(value, (int, float)):
            continue
        if math.isfinite(value) and value >= bound:
            return True
    return False


def _stop_event_for(session: SessionLike) -> threading.Event:
    """The Event set once the driver asks the trial to stop (the runtime session's own)."""
    native = getattr(session, "stop_event", None)
    if isinstance(native, threading.Event):
        return native
    # A session without one (an older runtime): set by the next report that sees the stop.
    return threading.Event()


# Which trial session is current (thread-local first: in-process test pools run
# trials in threads).
_CURRENT: CurrentSlot[TrialSession] = CurrentSlot()


def current_session() -> TrialSession | None:
    """The trial session of the calling thread (or the only one in this process)."""
    return _CURRENT.get()


@contextlib.contextmanager
def _activate(session: TrialSession) -> Iterator[None]:
    _CURRENT.activate(session)
    try:
        yield
    finally:
        _CURRENT.deactivate(session)


def _require_session(what: str) -> TrialSession:
    session = current_session()
    if session is None:
        raise _tune_error(
            f"tune.{what}() was called outside a trial; call it inside the function "
            "passed to tune.Tuner(...)"
        )
    return session


class TrialRunner:
    """The function the driver launches on a pool worker for each trial attempt.

    One object per sweep (the pool ships it once per actor), holding the trial
    function and what all trials share.

    Args:
        trainable: The user's trial function ``(config) -> None | dict | number``.
        sweep: What every trial shares (experiment storage, retention, ...).
    """

    def __init__(self, trainable: Callable[[dict[str, Any]], Any], sweep: SweepInfo) -> None:
        self.trainable = trainable
        self.sweep = sweep
        self._base_uri: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"trainable": self.trainable, "sweep": self.sweep, "_base_uri": None}

    def trial_uri(self, trial_name: str) -> str:
        """URL (or local path) of a trial's directory."""
        if self._base_uri is None:
            self._base_uri = self.sweep.experiment.uri.rstrip("/")
        return f"{self._base_uri}/{trial_name}"

    def __call__(self, spec: TrialSpec, _session: SessionLike | None = None) -> tuple[str, Any]:
        runtime_session = _session if _session is not None else runtime_worker.get_session()
        if runtime_session is None:
            raise _tune_error("TrialRunner must run inside a lumos.runtime worker")
        trial_uri = self.trial_uri(spec.directory)
        session = TrialSession(spec, self.sweep, runtime_session, trial_uri)
        ctx = job_context.JobContext(
            kind="tune.trial",
            name=spec.trial_name,
            storage_path=trial_uri,
            storage_filesystem=self.sweep.experiment.fs,
            report=session.report,
            stop_event=session.stop_event,
            stop_error=lambda: pruned_error(
                f"trial {spec.trial_name!r} was ended early by the driver"
            ),
            resources_hint={"trial_resources": session.context.get_trial_resources()},
            id=spec.trial_id,
            report_checkpoint=session.report_nested,
            starting_checkpoint=(
                f"{trial_uri}/{spec.checkpoint_dir}" if spec.checkpoint_dir else None
            ),
            nested_run_name=spec.nested_run_name,
        )
        with _activate(session), job_context.running(ctx):
            try:
                result = self.trainable(spec.config)
            except runtime_worker.StopRequested as exc:
                return (PRUNED, str(exc) or "stopped by the driver")
            except Exception as exc:
                if is_pruned(exc):
                    return (PRUNED, str(exc))
                raise
            session.final_report(result)
            return (DONE, None)


# -- public worker-side functions --------------------------------------------------------


def report(metrics: Mapping[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """Report metrics (and optionally a checkpoint) of the current trial.

    Each call is one step for the pruner and one row of the trial's
    ``metrics_dataframe``; ``training_iteration`` (1, 2, ...) is added. With a
    checkpoint, its files are copied into the trial's directory and committed
    (``CheckpointConfig`` retention applies) before the report is sent.

    Args:
        metrics: Metric names to numbers (any JSON-able values are kept).
        checkpoint: A ``tune.Checkpoint`` of a local directory to keep.

    Raises:
        TrialPruned: The driver ended this trial early (pruner or stop criteria) after
            an earlier report. Let it propagate (or return).

    Example:
        >>> def objective(config):
        ...     for step in range(10):
        ...         tune.report({"loss": 1.0 / (step + 1)})
    """
    _require_session("report").report(metrics, checkpoint)


def get_checkpoint() -> Checkpoint | None:
    """The current trial's latest committed checkpoint (after a retry or resume), or None.

    Example:
        >>> def objective(config):
        ...     start = 0
        ...     if (ckpt := tune.get_checkpoint()) is not None:
        ...         with ckpt.as_directory() as d:
        ...             start = int(open(f"{d}/step").read()) + 1
    """
    return _require_session("get_checkpoint").get_checkpoint()


def get_context() -> TrialContext:
    """The current trial's :class:`TrialContext` (ids, names, directory, storage)."""
    return _require_session("get_context").context
