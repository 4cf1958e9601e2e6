"""TrainController: runs one training run as an event-driven state machine.

It lives in the process that calls ``fit()``. The workers are a
``lumos.runtime.WorkerGroup``; every decision about failures and scale comes
from the runtime's policy objects, the controller only executes them::

    Initializing -> Scheduling -> Running -> Finished
                       ^            |  \\-> Aborted   (Ctrl-C, parent job stops it)
                       |            v
                       +------ Restarting -> Errored (FailurePolicy says RAISE)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lumos.runtime import (
    ErrorEvent,
    Event,
    FailureKind,
    FailurePolicy,
    FinishedEvent,
    FixedScalingPolicy,
    ReportEvent,
    ResizeDecision,
    ScalingPolicy,
    WorkerDiedEvent,
    WorkerFailure,
    WorkerGroupSpec,
    WorkerHungEvent,
    WorkerInfo,
)
from lumos.storage import (
    AttemptRecord,
    Checkpoint,
    CheckpointRecord,
    RetentionPolicy,
    RunState,
    RunStorage,
)
from lumos.train._internal.backend import Backend
from lumos.train._internal.callback import Callback
from lumos.train._internal.console import Console
from lumos.train._internal.controller.state import (
    AbortedState,
    ControllerState,
    ErroredState,
    FinishedState,
    InitializingState,
    RestartingState,
    RunningState,
    SchedulingState,
)
from lumos.train._internal.errors import CheckpointReportError, TrainingFailedError
from lumos.train._internal.result import Result, result_from_state
from lumos.train._internal.session import ACK, REPORT, WorkerRunArgs, run_train_worker

if TYPE_CHECKING:
    from lumos.runtime.context import JobContext


class WorkerGroupLike(Protocol):
    """The part of ``lumos.runtime.WorkerGroup`` the controller uses (a fake has it too)."""

    @property
    def workers(self) -> list[WorkerInfo]: ...

    def launch(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        per_rank_kwargs: list[dict[str, Any]] | None = None,
    ) -> None: ...

    def poll(self, timeout_s: float | None) -> list[Event]: ...

    def send(self, value: Any, ranks: list[int] | None = None) -> None: ...

    def request_stop(self) -> None: ...

    def replace_workers(self, ranks: list[int]) -> list[int] | None: ...

    def shutdown(self, grace_period_s: float = 5.0) -> None: ...


class GroupFactory(Protocol):
    """Starts a worker group: ``WorkerGroup.start`` or a fake's ``start``.

    ``on_waiting`` gets a one-line "waiting for resources: ..." message while the
    group cannot be placed yet.
    """

    def __call__(
        self, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
    ) -> WorkerGroupLike: ...


@dataclass
class ControllerSettings:
    """Tuning knobs of the controller (not user-facing)."""

    poll_interval_s: float = 0.25
    """Longest wait in one poll; bounds how late a stop request or a flush is noticed."""
    stop_grace_s: float = 15.0
    """How long surviving workers get to end their training thread before a full restart."""
    shutdown_grace_s: float = 2.0
    metrics_flush_rows: int = 200
    metrics_flush_interval_s: float = 2.0


@dataclass
class _Pending:
    index: int
    reports: dict[int, tuple[dict[str, Any], str | None]] = field(default_factory=dict)

    def has_checkpoint(self) -> bool:
        return any(d is not None for _, d in self.reports.values())


class _RunIsBroken(Exception):
    """A non-retryable mistake in how the training function uses the API."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _retry(decision: Any) -> bool:
    return bool(decision.should_retry)


class TrainController:
    """Drives one run from start to a terminal state (see the module docstring).

    Args:
        train_fn: the user's per-worker function.
        config: ``train_loop_config`` passed to it.
        pass_config: whether ``train_fn`` takes the config argument.
        spec: the worker group to start (``num_workers`` may be changed by the scaling policy).
        storage: the run's storage; ``run_state`` its current state (already restored).
        failure_policy / scaling_policy: the runtime's policy objects.
        retention: which committed checkpoints to keep.
        backend: framework setup around the function (torch process group).
        group_factory: starts a worker group (``WorkerGroup.start`` or a fake).
        restart_strategy: ``"replace_failed"`` or ``"full_group"``.
        callbacks: driver-side callbacks.
        job_context: the enclosing job (a Tune trial) or ``None``.
        console: where state lines go.
        settings: internal timing knobs.
        worker_storage: ``(storage_path, filesystem)`` as configured, for the workers.
    """

    def __init__(
        self,
        *,
        train_fn: Callable[..., Any],
        config: dict[str, Any] | None,
        pass_config: bool,
        spec: WorkerGroupSpec,
        storage: RunStorage,
        run_state: RunState,
        failure_policy: FailurePolicy,
        scaling_policy: ScalingPolicy | None = None,
        retention: RetentionPolicy | None = None,
        backend: Backend | None = None,
        group_factory: GroupFactory,
        restart_strategy: str = "replace_failed",
        callbacks: list[Callback] | None = None,
        job_context: JobContext | None = None,
        console: Console | None = None,
        settings: ControllerSettings | None = None,
        worker_storage: tuple[str, Any] | None = None,
    ) -> None:
        self.train_fn = train_fn
        self.config = config
        self.pass_config = pass_config
        self.spec = spec
        self.storage = storage
        self.run_state = run_state
        self.failure_policy = failure_policy
        self.scaling_policy = scaling_policy or FixedScalingPolicy(spec.num_workers)
        self.retention = retention
        self.backend = backend or Backend()
        self.group_factory = group_factory
        self.restart_strategy = restart_strategy
        self.callbacks = list(callbacks or [])
        self.job_context = job_context
        self.console = console or Console(verbose=False)
        self.settings = settings or ControllerSettings()
        # how workers open the run's storage: the configured (path, filesystem or None)
        self.worker_storage: tuple[str, Any] = worker_storage or (
            str(storage.storage_path),
            storage.fs,
        )

        self.group: WorkerGroupLike | None = None
        self.state: ControllerState = InitializingState()
        self.history: list[ControllerState] = []
        self.failures_so_far = 0
        self.last_metrics: dict[str, Any] = {}
        self.last_error: TrainingFailedError | None = None
        self._cleanup_needed = False
        # per attempt
        self._world_size = 0
        self._attempt = -1
        self._running: set[int] = set()
        self._finished: set[int] = set()
        self._pending: dict[int, _Pending] = {}
        # metrics history buffer (rank 0 reports not yet written)
        self._rows: list[dict[str, Any]] = []
        self._rows_start = 0
        self._last_flush = time.monotonic()

    # -- driver -------------------------------------------------------------------------
    def run(self) -> Result:
        """Run to a terminal state; return the result or raise the run's error."""
        try:
            while not self.state.terminal:
                self._transition(self._step(self.state))
        except BaseException as exc:  # Ctrl-C, a callback or the parent job raised
            self._transition(AbortedState(exc))
        return self._finalize(self.state)

    def _transition(self, new: ControllerState) -> None:
        if new is not self.state:
            self.history.append(new)
        self.state = new

    def _step(self, state: ControllerState) -> ControllerState:
        if isinstance(state, InitializingState):
            return self._initialize()
        if isinstance(state, SchedulingState):
            return self._schedule(state)
        if isinstance(state, RunningState):
            return self._run_once(state)
        if isinstance(state, RestartingState):
            return self._restart(state)
        raise AssertionError(f"no handler for controller state {state!r}")  # pragma: no cover

    # -- states -------------------------------------------------------------------------
    def _initialize(self) -> ControllerState:
        resume = self.run_state.latest()
        self._set_status("running")
        return SchedulingState(attempt=len(self.run_state.attempts), resume_from=resume)

    def _schedule(self, state: SchedulingState) -> ControllerState:
        try:
            if state.replace_ranks is None or self.group is None:
                self._shutdown_group()
                decision = self.scaling_policy.make_decision(None, {})
                num = (
                    decision.num_workers
                    if isinstance(decision, ResizeDecision)
                    else self.spec.num_workers
                )
                spec = dataclasses.replace(self.spec, num_workers=num)
                t0 = time.monotonic()
                self.group = self.group_factory(spec, on_waiting=self.console.info)
                self.console.info(
                    f"started {num} worker(s) in {time.monotonic() - t0:.1f} s "
                    f"({self._describe_nodes()})"
                )
            group = self.group
            assert group is not None
            if self._cleanup_needed:
                # the failed attempt's unfinished uploads (no rank is writing any more)
                self.storage.delete_uncommitted()
                self._cleanup_needed = False
            hooks = self.backend.prepare_launch(group)
            resume = state.resume_from
            args = WorkerRunArgs(
                run_name=self.storage.name,
                storage_path=self.worker_storage[0],
                filesystem=self.worker_storage[1],
                attempt=state.attempt,
                report_index_base=resume.report_index + 1 if resume else 0,
                checkpoint_dir_name=resume.dir_name if resume else None,
                pass_config=self.pass_config,
            )
            self._begin_attempt(state.attempt, len(group.workers), args.report_index_base)
            group.launch(run_train_worker, args=(self.train_fn, self.config, args, hooks))
        except Exception as exc:  # the group could not start, or the backend setup failed
            failure = WorkerFailure(
                rank=-1,
                kind=FailureKind.SCHEDULING_TIMEOUT,
                node_id=None,
                error=None,
                message=f"could not start the workers: {type(exc).__name__}: {exc}",
            )
            self._record_error(exc)
            return RestartingState(failures=(failure,), attempt=state.attempt)
        return RunningState(attempt=state.attempt)

    def _run_once(self, state: RunningState) -> ControllerState:
        group = self.group
        assert group is not None
        events = group.poll(self.settings.poll_interval_s)
        failures: list[WorkerFailure] = []
        ended: set[int] = set()
        try:
            for event in events:
                failure = self._handle_event(event)
                if failure is not None:
                    failures.append(failure)
                    ended.add(event.rank)
        except _RunIsBroken as broken:
            return ErroredState(self._failed_error(str(broken.error), {-1: broken.error}))
        self._check_parent_stop()
        self._maybe_flush()
        if failures:
            return RestartingState(
                failures=tuple(failures),
                attempt=state.attempt,
                ended_ranks=frozenset(ended | (set(range(self._world_size)) - self._running)),
            )
        if not self._running:
            return self._finish()
        return state

    def _restart(self, state: RestartingState) -> ControllerState:
        self._flush_metrics()
        failures = list(state.failures)
        decision = self.failure_policy.make_decision(failures, self.failures_so_far)
        retry = _retry(decision)
        self._record_attempt_end("errored", "; ".join(f.message for f in failures))
        for cb in self.callbacks:
            cb.on_failure(failures, retry)
        worker_errors = self._worker_errors(failures)
        if not retry:
            self.console.info(f"giving up: {decision.reason}")
            return ErroredState(
                self._failed_error(str(decision.reason), worker_errors, self.failures_so_far)
            )
        self.failures_so_far += 1
        self._cleanup_needed = True
        resume = self.run_state.latest()
        limit = self._max_failures_text()
        where = f"checkpoint {resume.dir_name!r}" if resume else "the start (no checkpoint yet)"
        for f in failures:
            self.console.info(f"{self._describe_failure(f)}")
        self.console.info(f"restarting (failure {self.failures_so_far} of {limit}) from {where}")
        dead = sorted(
            {
                f.rank
                for f in failures
                if f.kind in (FailureKind.ACTOR_DIED, FailureKind.HUNG) and f.rank >= 0
            }
        )
        next_state: ControllerState
        if (
            self.restart_strategy == "replace_failed"
            and self.group is not None
            and not any(f.rank < 0 for f in failures)
        ):
            try:
                extra_dead = self._replace_and_wind_down(dead, state.ended_ranks)
                next_state = SchedulingState(
                    attempt=state.attempt + 1,
                    resume_from=resume,
                    replace_ranks=tuple(sorted(set(dead) | extra_dead)),
                )
            except Exception as exc:
                self.console.info(
                    f"replacing the failed workers did not work ({type(exc).__name__}: {exc}); "
                    "starting a new worker group"
                )
                next_state = SchedulingState(attempt=state.attempt + 1, resume_from=resume)
        else:
            next_state = SchedulingState(attempt=state.attempt + 1, resume_from=resume)
        for cb in self.callbacks:
            cb.on_restart(
                state.attempt + 1, self.storage.checkpoint(resume.dir_name) if resume else None
            )
        return next_state

    def _finish(self) -> ControllerState:
        self._flush_metrics()
        self._record_attempt_end("finished", None)
        self._set_status("finished")
        result = result_from_state(self.storage, self.run_state, metrics=dict(self.last_metrics))
        latest = self.run_state.latest()
        self.console.info(
            f"finished run {self.storage.name!r}: {self._rows_start} report(s)"
            + (f", latest checkpoint {latest.dir_name!r}" if latest else "")
            + f"; results in {self.storage.uri}"
        )
        return FinishedState(result)

    def _finalize(self, state: ControllerState) -> Result:
        """Release the workers, record the outcome, call on_finish; return or raise."""
        released = self._shutdown_group()
        if isinstance(state, FinishedState):
            for cb in self.callbacks:
                cb.on_finish(state.result, None)
            return state.result
        if released:
            # An aborted or failed run may leave a checkpoint upload that never committed
            # (e.g. a Tune trial pruned while its ranks upload). No rank can write any more,
            # and such a run may never be resumed (where restore would clean up), so remove
            # it now; committed checkpoints are named in the run state and always kept.
            self._safe(self._delete_uncommitted)
        error: BaseException
        if isinstance(state, ErroredState):
            error = state.error
            self._safe(lambda: self._set_status("errored"))
        else:
            assert isinstance(state, AbortedState)
            error = state.error
            self._safe(self._flush_metrics)
            self._safe(lambda: self._record_attempt_end("aborted", repr(error)))
            self._safe(lambda: self._set_status("aborted"))
            if isinstance(error, KeyboardInterrupt):
                self.console.info(
                    f"interrupted; run {self.storage.name!r} resumes from its latest checkpoint "
                    "when fit() is called again with the same RunConfig(storage_path, name)"
                )
        for cb in self.callbacks:
            self._safe(lambda cb=cb: cb.on_finish(None, error))  # type: ignore[misc]
        raise error

    # -- events -------------------------------------------------------------------------
    def _handle_event(self, event: Event) -> WorkerFailure | None:
        if isinstance(event, ReportEvent):
            self._on_report(event)
            return None
        if isinstance(event, FinishedEvent):
            self._on_finished(event.rank)
            return None
        node = self._node_of(event.rank)
        if isinstance(event, ErrorEvent):
            self._running.discard(event.rank)
            first = event.error.message.strip().splitlines()
            return WorkerFailure(
                rank=event.rank,
                kind=FailureKind.USER_ERROR,
                node_id=node,
                error=event.error,
                message=f"{event.error.exc_type.rsplit('.', 1)[-1]}: {first[0] if first else ''}",
            )
        if isinstance(event, WorkerDiedEvent):
            self._running.discard(event.rank)
            return WorkerFailure(
                rank=event.rank,
                kind=FailureKind.ACTOR_DIED,
                node_id=event.node_id or node,
                error=None,
                message=f"worker process died ({event.reason})",
            )
        if isinstance(event, WorkerHungEvent):
            self._running.discard(event.rank)
            return WorkerFailure(
                rank=event.rank,
                kind=FailureKind.HUNG,
                node_id=event.node_id or node,
                error=None,
                message=f"worker did not answer for {event.waited_s:.0f} s (hung)",
            )
        return None  # pragma: no cover - unknown event kinds are ignored

    def _on_report(self, event: ReportEvent) -> None:
        payload = event.payload
        if not (isinstance(payload, tuple) and payload and payload[0] == REPORT):
            return
        _, attempt, index, metrics, dir_name = payload
        if attempt != self._attempt:
            return  # a late report of an attempt that already failed
        rank = event.rank
        if rank == 0:
            self._add_row(index, metrics)
            self.last_metrics = metrics
            if dir_name is None:
                self._deliver(metrics, None)
        pending = self._pending.get(index)
        if pending is None:
            pending = self._pending[index] = _Pending(index)
        pending.reports[rank] = (metrics, dir_name)
        if len(pending.reports) >= self._world_size:
            del self._pending[index]
            if pending.has_checkpoint():
                self._commit(pending)
        elif dir_name is not None:
            self._check_unreportable(pending)

    def _on_finished(self, rank: int) -> None:
        self._running.discard(rank)
        self._finished.add(rank)
        for pending in self._pending.values():
            self._check_unreportable(pending)

    def _check_unreportable(self, pending: _Pending) -> None:
        """A checkpoint that a finished rank never reported can never commit: fail clearly."""
        if not pending.has_checkpoint():
            return
        missing = sorted(self._finished - set(pending.reports))
        if missing:
            raise _RunIsBroken(
                CheckpointReportError(
                    f"rank(s) {missing} returned without calling train.report() for report "
                    f"#{pending.index}, which rank(s) {sorted(pending.reports)} reported "
                    "with a checkpoint; every rank must call train.report() the same "
                    "number of times (pass checkpoint=None on ranks that save nothing)"
                )
            )

    def _commit(self, pending: _Pending) -> None:
        names = {r: d for r, (_, d) in pending.reports.items() if d is not None}
        if len(set(names.values())) > 1:
            detail = ", ".join(f"rank {r}: {d!r}" for r, d in sorted(names.items()))
            raise _RunIsBroken(
                CheckpointReportError(
                    f"train.report() #{pending.index} got different checkpoint_dir_name values "
                    f"across ranks ({detail}); every rank must pass the same "
                    "checkpoint_dir_name (or none) for one report"
                )
            )
        dir_name = next(iter(names.values()))
        metrics = pending.reports[0][0] if 0 in pending.reports else {}
        record = CheckpointRecord(
            dir_name=dir_name, metrics=metrics, report_index=pending.index, created_at=time.time()
        )
        self._flush_metrics()
        self.run_state, _deleted = self.storage.commit_checkpoint(
            self.run_state, record, self.retention
        )
        group = self.group
        assert group is not None
        group.send((ACK, pending.index), ranks=sorted(names))
        if 0 in names:
            self._deliver(metrics, self.storage.checkpoint(dir_name))

    def _deliver(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        for cb in self.callbacks:
            cb.on_report(metrics, checkpoint)
        if self.job_context is not None:
            self.job_context.report(metrics)

    def _check_parent_stop(self) -> None:
        ctx = self.job_context
        if ctx is not None and ctx.stop_event.is_set():
            raise ctx.stop_error()

    # -- restarts -----------------------------------------------------------------------
    def _replace_and_wind_down(self, dead: list[int], ended: frozenset[int]) -> set[int]:
        """Replace the dead ranks; wait until the survivors' training threads ended.

        Returns the survivors that died meanwhile (replaced too).

        Raises:
            TimeoutError: a survivor did not end its thread within ``stop_grace_s``.
        """
        group = self.group
        assert group is not None
        group.request_stop()
        waiting = set(range(self._world_size)) - set(dead) - set(ended)
        if dead:
            self._replace(group, dead)
        extra_dead: set[int] = set()
        deadline = time.monotonic() + self.settings.stop_grace_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"rank(s) {sorted(waiting)} did not end their training function within "
                    f"{self.settings.stop_grace_s:.0f} s"
                )
            for event in group.poll(min(remaining, 1.0)):
                if event.rank not in waiting:
                    continue
                if isinstance(event, FinishedEvent | ErrorEvent):
                    waiting.discard(event.rank)
                elif isinstance(event, WorkerDiedEvent | WorkerHungEvent):
                    waiting.discard(event.rank)
                    extra_dead.add(event.rank)
        if extra_dead:
            self._replace(group, sorted(extra_dead))
        return extra_dead

    def _replace(self, group: WorkerGroupLike, ranks: list[int]) -> None:
        t0 = time.monotonic()
        by_standby = sorted(group.replace_workers(ranks) or [])
        fresh = [r for r in ranks if r not in by_standby]
        parts: list[str] = []
        if by_standby:
            parts.append(f"the standby worker took over {_ranks(by_standby)}")
        if fresh:
            parts.append(f"a new worker process for {_ranks(fresh)}")
        self.console.info(
            f"replaced {_ranks(ranks)} in {time.monotonic() - t0:.2f} s ({'; '.join(parts)})"
        )

    # -- bookkeeping --------------------------------------------------------------------
    def _begin_attempt(self, attempt: int, world_size: int, base: int) -> None:
        self._attempt = attempt
        self._world_size = world_size
        self._running = set(range(world_size))
        self._finished = set()
        self._pending = {}
        # rows after the resume point are replaced by this attempt's reports
        self._rows = [r for i, r in enumerate(self._rows) if self._rows_start + i < base]
        if not self._rows:
            self._rows_start = base
        attempts = [a for a in self.run_state.attempts if a.index != attempt]
        attempts.append(AttemptRecord(index=attempt, started_at=time.time()))
        self.run_state = self.run_state.model_copy(
            update={"attempts": attempts, "status": "running", "updated_at": time.time()}
        )
        self.storage.save_state(self.run_state)

    def _record_attempt_end(self, status: str, error: str | None) -> None:
        attempts = list(self.run_state.attempts)
        if not attempts or attempts[-1].ended_at is not None:
            return
        last = attempts[-1].model_copy(
            update={"ended_at": time.time(), "status": status, "error": error}
        )
        attempts[-1] = last
        self.run_state = self.run_state.model_copy(update={"attempts": attempts})
        self.storage.save_state(self.run_state)

    def _set_status(self, status: str) -> None:
        self.run_state = self.run_state.model_copy(
            update={"status": status, "updated_at": time.time()}
        )
        self.storage.save_state(self.run_state)

    def _add_row(self, index: int, metrics: dict[str, Any]) -> None:
        if self._rows and index != self._rows_start + len(self._rows):
            self._flush_metrics()
        if not self._rows:
            self._rows_start = index
        self._rows.append(metrics)
        if len(self._rows) >= self.settings.metrics_flush_rows:
            self._flush_metrics()

    def _maybe_flush(self) -> None:
        if (
            self._rows
            and time.monotonic() - self._last_flush >= self.settings.metrics_flush_interval_s
        ):
            self._flush_metrics()

    def _flush_metrics(self) -> None:
        self._last_flush = time.monotonic()
        if not self._rows:
            return
        rows, start = self._rows, self._rows_start
        self.storage.append_metrics(rows, start)
        self._rows = []
        self._rows_start = start + len(rows)

    def _record_error(self, exc: BaseException) -> None:
        self.console.info(f"{type(exc).__name__}: {exc}")

    def _shutdown_group(self) -> bool:
        """Shut the group down (if any); False when that raised (workers may still run)."""
        group, self.group = self.group, None
        if group is None:
            return True
        try:
            group.shutdown(self.settings.shutdown_grace_s)
        except Exception as exc:  # cleanup must not hide the run's own error
            self.console.warning(f"cleanup step failed: {type(exc).__name__}: {exc}")
            return False
        return True

    def _delete_uncommitted(self) -> None:
        removed = self.storage.delete_uncommitted()
        if removed:
            self.console.info(f"removed unfinished checkpoint upload(s) {removed}")

    def _safe(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # cleanup must not hide the run's own error
            self.console.warning(f"cleanup step failed: {type(exc).__name__}: {exc}")

    def _failed_error(
        self, message: str, worker_errors: dict[int, BaseException], failures: int = 0
    ) -> TrainingFailedError:
        error = TrainingFailedError(
            f"Training run {self.storage.name!r} failed: {message}", worker_errors, failures
        )
        self.last_error = error
        return error

    def _worker_errors(self, failures: list[WorkerFailure]) -> dict[int, BaseException]:
        errors: dict[int, BaseException] = {}
        for f in failures:
            errors[f.rank] = (
                f.error if f.error is not None else RuntimeError(f"{self._describe_failure(f)}")
            )
        return errors

    def _max_failures_text(self) -> str:
        limit = getattr(self.failure_policy, "max_failures", None)
        return "unlimited" if limit is None or limit < 0 else str(limit)

    def _node_of(self, rank: int) -> str | None:
        group = self.group
        if group is None or not 0 <= rank < len(group.workers):
            return None
        return group.workers[rank].node_id

    def _describe_failure(self, f: WorkerFailure) -> str:
        if f.rank < 0:
            return f.message
        where = ""
        group = self.group
        if group is not None and 0 <= f.rank < len(group.workers):
            w = group.workers[f.rank]
            where = f" on node {w.node_ip} ({(f.node_id or w.node_id)[:8]}), pid {w.pid}"
        elif f.node_id:
            where = f" on node {f.node_id[:8]}"
        return f"rank {f.rank}{where}: {f.message}"

    def _describe_nodes(self) -> str:
        group = self.group
        if group is None:
            return ""
        nodes = sorted({w.node_ip for w in group.workers})
        return f"{len(nodes)} node(s): {', '.join(nodes)}"


def _ranks(ranks: list[int]) -> str:
    """Format ranks for the console: ``rank 1`` or ``ranks 0, 2``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in sorted(ranks))
