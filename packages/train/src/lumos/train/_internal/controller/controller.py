"""TrainController: runs one training run as an event-driven state machine.

It lives in the process that calls ``fit()`` and holds the state transitions
only; the work of each state is done by its collaborators::

    Initializing -> Scheduling -> Running -> Finished
                       ^            |  \\-> Aborted   (Ctrl-C, parent job stops it)
                       |            v
                       +------ Restarting -> Errored (FailurePolicy says RAISE)
                       |            |
                       +------ RollingBack -> Errored (max_rollbacks used up)
                               (a health check fired)

* ``GroupDriver`` (group.py): starts, replaces and shuts down the worker group.
* ``ReportAggregator`` (reports.py): pure; turns the ranks' reports into commits.
* ``MetricsBuffer`` (metrics_buffer.py): rank 0's report rows into the history.
* ``RunBook`` (run_book.py): the stored run state (status, attempts, commits).
* ``messages`` (messages.py): the text of every console line.
* ``ValidationRunner`` (validations.py): runs committed checkpoints' validations.
* ``HealthMonitor`` (health_monitor.py): runs the health checks; a firing check
  rolls training back to an earlier checkpoint (``RollingBackState``).
* The runtime's ``FailurePolicy`` decides RETRY or RAISE; its decision explains itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.runtime import (
    Event,
    FailureAction,
    FailureDecision,
    FailureKind,
    FinishedEvent,
    FixedScalingPolicy,
    ReportEvent,
    WorkerFailure,
    WorkerPreemptedEvent,
)
from lumos.storage import StorageIOError
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.failures import failure_of, upload_failure
from lumos.train._internal.controller.group import GroupDriver
from lumos.train._internal.controller.health_monitor import Fired, HealthCheckError, HealthMonitor
from lumos.train._internal.controller.metrics_buffer import MetricsBuffer
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.controller.run_book import RunBook
from lumos.train._internal.controller.scaling import PLACE_S, Move, Resizer
from lumos.train._internal.controller.state import (
    AbortedState,
    ControllerState,
    ErroredState,
    FinishedState,
    InitializingState,
    ResizingState,
    RestartingState,
    RollingBackState,
    RunningState,
    SchedulingState,
)
from lumos.train._internal.controller.validations import (
    Outcome,
    RayValidationLauncher,
    ValidationRunner,
)
from lumos.train._internal.data_positions import write_positions
from lumos.train._internal.errors import (
    CheckpointReportError,
    DriverTerminated,
    TrainConfigError,
    TrainingFailedError,
)
from lumos.train._internal.health import RollbackInfo
from lumos.train._internal.session import WorkerRunArgs, run_train_worker, trial_of
from lumos.train._internal.wire import RankReport, commit_message, decode, validated_message

if TYPE_CHECKING:
    from lumos.storage import Checkpoint, CheckpointRecord
    from lumos.train._internal.controller.spec import ControllerSpec
    from lumos.train._internal.result import Result

_DEAD = (FailureKind.ACTOR_DIED, FailureKind.HUNG)


class _RunIsBroken(Exception):
    """The ranks use the report API in a way no retry can fix."""

    def __init__(self, error: CheckpointReportError) -> None:
        super().__init__(str(error))
        self.error = error


class _RollbackRequested(Exception):
    """A health check fired: leave the running state for ``RollingBackState``."""

    def __init__(self, fired: Fired) -> None:
        super().__init__(fired.rollback.reason)
        self.fired = fired
        self.dead: frozenset[int] = frozenset()  # ranks that died in the same batch


class TrainController:
    """Drives one run from start to a terminal state (see the module docstring).

    Args:
        spec: What to run and with which collaborators.

    Attributes:
        state: The current state.
        history: Every state entered, in order (tests read it).
    """

    def __init__(self, spec: ControllerSpec) -> None:
        settings = spec.settings
        self.spec = spec
        self.console = spec.console
        self.book = RunBook(spec.storage, spec.run_state, spec.retention)
        self.workers = GroupDriver(
            spec.group_factory,
            spec.console,
            shutdown_grace_s=settings.shutdown_grace_s,
            stop_grace_s=settings.stop_grace_s,
        )
        self.metrics = MetricsBuffer(
            spec.storage.append_metrics,
            max_rows=settings.metrics_flush_rows,
            interval_s=settings.metrics_flush_interval_s,
        )
        self.state: ControllerState = InitializingState()
        self.history: list[ControllerState] = []
        self.failures_so_far = 0
        self.rollbacks_so_far = 0
        self.last_metrics: dict[str, Any] = {}
        self.health = (
            HealthMonitor(spec.health_checks, self._stored_history())
            if spec.health_checks
            else None
        )
        self.validations: ValidationRunner | None = None  # started at the first validation
        group_spec = spec.group_spec
        self.elastic = group_spec.min_workers is not None
        self.scaling = Resizer(
            spec.scaling_policy or FixedScalingPolicy(group_spec.num_workers),
            elastic=self.elastic,
            interval_s=spec.resize_interval_s,
        )
        self.preemptions_so_far = 0
        self._resize_started: float | None = None
        self._at_boundary = False  # a checkpoint committed in this loop iteration
        self._rollback_fired_at: float | None = None
        self._said_waiting = False
        self._cleanup_needed = False
        # the current attempt
        self._attempt = -1
        self._world_size = 0
        self._running: set[int] = set()
        self._reports = ReportAggregator(0)
        self._collecting = False  # winding down after a failure: collecting the other ends
        self._stragglers = False  # a rank did not end within stop_grace_s

    # -- driver -------------------------------------------------------------------------
    def run(self) -> Result:
        """Run to a terminal state; return the result or raise the run's error."""
        try:
            while not self.state.terminal:
                self._transition(self._step(self.state))
        except StorageIOError as exc:  # permanent, or transient past the retry budget
            self._transition(ErroredState(self._failed_error(f"storage failed: {exc}", {-1: exc})))
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
        if isinstance(state, RollingBackState):
            return self._rollback(state)
        if isinstance(state, ResizingState):
            return self._resize(state)
        raise AssertionError(f"no handler for controller state {state!r}")  # pragma: no cover

    # -- states -------------------------------------------------------------------------
    def _initialize(self) -> ControllerState:
        self.book.settle_rollbacks()  # a rollback the previous driver did not finish
        self._resubmit_validations()
        resume = self.book.latest()
        self.book.set_status("running")
        storage = self.spec.storage
        for cb in self.spec.callbacks:
            cb.on_start(storage.name, storage.uri, self.spec.config)
        return SchedulingState(attempt=self.book.attempts, resume_from=resume)

    def _schedule(self, state: SchedulingState) -> ControllerState:
        spec = self.spec
        step = "start the workers"  # what failed, for the failure's message
        try:
            group = self.workers.group
            if not state.keep_group or group is None:
                # the group size is the ScalingConfig's num_workers (no elastic resizing yet)
                group = self.workers.start(spec.group_spec)
            if self._cleanup_needed:
                step = "remove the failed attempt's unfinished checkpoint uploads"
                self.book.delete_uncommitted()  # no rank is writing any more
                self._cleanup_needed = False
            step = "set up the training backend on the workers"
            hooks = spec.backend.prepare_launch(group)
            step = "launch the training function on the workers"
            args = self._run_args(state)
            self._begin_attempt(state.attempt, len(group.workers), args.report_index_base)
            group.launch(run_train_worker, args=(spec.train_fn, spec.config, args, hooks))
            if spec.validation_config is not None:
                self._validator()  # its task workers warm up while the workers start
            if self._rollback_fired_at is not None:
                seconds = time.monotonic() - self._rollback_fired_at
                self._rollback_fired_at = None
                self.console.info(messages.rolled_back_line(state.resume_from, seconds))
            if self._resize_started is not None:
                seconds = time.monotonic() - self._resize_started
                self._resize_started = None
                self.console.info(
                    messages.resumed_after_resize_line(
                        len(group.workers), state.resume_from, seconds
                    )
                )
        except Exception as exc:
            self.console.info(f"{type(exc).__name__}: {exc}")
            failure = WorkerFailure(
                rank=-1,
                kind=FailureKind.START_FAILED,
                message=f"could not {step}: {type(exc).__name__}: {exc}",
            )
            return RestartingState(failures=(failure,), attempt=state.attempt)
        return RunningState(attempt=state.attempt)

    def _run_once(self, state: RunningState) -> ControllerState:
        interval = self.spec.settings.poll_interval_s
        events = self.workers.current().poll(interval if self._running else 0.0)
        try:
            failures = self._handle_events(events)
            if failures:
                failures += self._collect_other_endings()
            else:
                self._poll_validations(0.0 if self._running else interval)
        except _RunIsBroken as broken:
            return ErroredState(self._failed_error(str(broken.error), {-1: broken.error}))
        except HealthCheckError as error:
            return ErroredState(self._failed_error(str(error), {-1: error}))
        except _RollbackRequested as request:
            gone = frozenset(set(range(self._world_size)) - self._running - request.dead)
            return RollingBackState(
                request.fired, state.attempt, ended_ranks=gone, dead_ranks=request.dead
            )
        self._check_parent_stop()
        self.metrics.maybe_flush()
        if failures:
            ended = set(range(self._world_size)) - self._running
            return RestartingState(
                failures=tuple(failures), attempt=state.attempt, ended_ranks=frozenset(ended)
            )
        boundary, self._at_boundary = self._at_boundary, False
        if self._running:
            move = self._scaling_step(boundary)
            if move is not None:
                stopped = frozenset(set(range(self._world_size)) - self._running)
                return ResizingState(move, state.attempt, ended_ranks=stopped)
        if not self._running:
            pending = self.validations.pending if self.validations is not None else 0
            if not pending:
                return self._finish()
            if not self._said_waiting:
                self._said_waiting = True
                self.console.info(messages.waiting_validations_line(pending))
        return state

    def _handle_events(self, events: list[Event]) -> list[WorkerFailure]:
        failures = []
        rollback: _RollbackRequested | None = None
        for event in events:
            if rollback is not None and isinstance(event, ReportEvent):
                continue  # the attempt is abandoned: only how ranks end still matters
            try:
                failure = self._handle_event(event)
            except _RollbackRequested as request:
                rollback = request
                continue
            if failure is not None:
                failures.append(failure)
        if rollback is not None:
            rollback.dead = frozenset(f.rank for f in failures if f.kind in _DEAD)
            raise rollback
        return failures

    def _collect_other_endings(self) -> list[WorkerFailure]:
        """After a first failure: stop the other ranks and collect how each one ended.

        Every real error (not a ``StopRequested`` ending) joins the failures, so the
        failure policy and ``TrainingFailedError.worker_errors`` see all of them. Waits
        at most ``stop_grace_s``; a rank still running then makes the restart start a
        new group.
        """
        if not self._running:
            return []
        group = self.workers.current()
        group.request_stop()
        failures: list[WorkerFailure] = []
        deadline = time.monotonic() + self.spec.settings.stop_grace_s
        self._collecting = True
        try:
            while self._running and (remaining := deadline - time.monotonic()) > 0:
                failures += self._handle_events(group.poll(min(remaining, 1.0)))
        finally:
            self._collecting = False
        self._stragglers = bool(self._running)
        return failures

    def _restart(self, state: RestartingState) -> ControllerState:
        self.metrics.flush()
        failures = list(state.failures)
        preempted = self.scaling.preempted
        preemption = all(f.rank in preempted and f.kind in _DEAD for f in failures)
        if preemption:
            decision = self._preemption_decision()  # its own budget
        else:
            decision = self.spec.failure_policy.make_decision(failures, self.failures_so_far)
        self.book.end_attempt("errored", "; ".join(f.message for f in failures))
        for cb in self.spec.callbacks:
            cb.on_failure(failures, decision.should_retry)
        if not decision.should_retry:
            self.console.info(messages.giving_up_line(decision))
            errors = self._worker_errors(failures)
            return ErroredState(self._failed_error(decision.reason, errors, self.failures_so_far))
        if preemption:
            self.preemptions_so_far += 1
        else:
            self.failures_so_far += 1
        self._cleanup_needed = True
        resume = self.book.latest()
        for f in failures:
            self.console.info(messages.describe_failure(f, self.workers.workers))
        self.console.info(messages.restarting_line(decision, resume))
        next_state = SchedulingState(
            attempt=state.attempt + 1, resume_from=resume, keep_group=self._reuse_group(state)
        )
        checkpoint = self.book.checkpoint(resume) if resume else None
        for cb in self.spec.callbacks:
            cb.on_restart(state.attempt + 1, checkpoint)
        return next_state

    def _preemption_decision(self) -> FailureDecision:
        """Ranks under a preemption notice died: ``max_preemption_failures`` decides."""
        limit = self.spec.max_preemption_failures
        used = self.preemptions_so_far + 1
        allowed = None if limit < 0 else limit
        if allowed is not None and used > allowed:
            return FailureDecision(
                FailureAction.RAISE,
                f"ranks under a preemption notice were lost {used} time(s), more than "
                f"FailureConfig(max_preemption_failures={limit}); raise it (-1 = unlimited)",
                used,
                allowed,
            )
        return FailureDecision(FailureAction.RETRY, "preempted ranks were lost", used, allowed)

    def _reuse_group(self, state: RestartingState) -> bool:
        """Replace the failed ranks in the running group; False: start a new group."""
        if (
            self.spec.restart_strategy != "replace_failed"
            or self.workers.group is None
            or self._stragglers
            or any(f.rank < 0 for f in state.failures)
        ):
            return False
        dead = sorted({f.rank for f in state.failures if f.kind in _DEAD})
        if self.elastic:  # drop the lost ranks; refill where there is room
            try:
                waiting = set(range(self._world_size)) - set(dead) - state.ended_ranks
                lost = sorted(set(dead) | self.workers.wind_down(waiting))
                self._change_size(lost, "worker(s) lost" if lost else "restart")
                self.scaling.moved(self.workers.current())
            except Exception as exc:
                self.console.info(messages.replace_failed_line(exc))
                return False
            return True
        try:
            self.workers.replace_and_wind_down(dead, state.ended_ranks, self._world_size)
        except Exception as exc:
            self.console.info(messages.replace_failed_line(exc))
            return False
        return True

    # -- elastic resizing and preemption --------------------------------------------------
    def _scaling_step(self, boundary: bool) -> Move | None:
        """Grow in the background; at a checkpoint boundary, the move to make now."""
        group = self.workers.current()
        size = len(group.workers)
        added = self.scaling.maybe_grow(group, self._world_size)
        if added:
            self.console.info(
                messages.grow_started_line(added, self._world_size, len(group.workers))
            )
        elif len(group.workers) < size:  # pragma: no cover - a runtime contract breach
            raise RuntimeError("lumos.train: the group shrank while growing")
        return self.scaling.pending() if boundary else None

    def _on_preempted(self, event: WorkerPreemptedEvent) -> None:
        if not self.scaling.on_preempted(event):
            return
        left = None
        if event.deadline_ms is not None:
            left = max(0.0, event.deadline_ms / 1000.0 - time.time())
        self.console.info(messages.preempted_line(event.rank, event.node_id, event.reason, left))

    def _resize(self, state: ResizingState) -> ControllerState:
        """At a checkpoint boundary: stop the ranks, grow or move the preempted ones."""
        move = state.move
        self._resize_started = time.monotonic()
        self.metrics.flush()
        self.book.end_attempt("resized", move.reason)
        resume = self.book.latest()
        try:
            dead = self.workers.wind_down(set(range(self._world_size)) - state.ended_ranks)
        except TimeoutError as exc:
            self.console.info(messages.replace_failed_line(exc))
            self.scaling.moved(None)
            return SchedulingState(attempt=state.attempt + 1, resume_from=resume)
        if not self.elastic:  # a fixed-size group moves by starting anew (off draining nodes)
            self.console.info(f"moving every rank to a new group ({move.reason})")
            self.scaling.moved(None)
            return SchedulingState(attempt=state.attempt + 1, resume_from=resume)
        self._change_size(sorted(set(move.preempted) | dead), move.reason)
        self.scaling.moved(self.workers.current())
        return SchedulingState(attempt=state.attempt + 1, resume_from=resume, keep_group=True)

    def _change_size(self, lost: list[int], reason: str) -> None:
        """Drop ``lost`` ranks of the elastic group; refill toward the policy's size."""
        group = self.workers.current()
        target = self.scaling.target(group, lost)
        _, after, seconds = self.workers.resize(lost, target, wait_s=PLACE_S)
        before = self._world_size  # ranks of the attempt (growth may have started earlier)
        min_workers = self.spec.group_spec.min_workers or 1
        waited = 0.0
        while after < min_workers:  # below the minimum: wait for capacity (bounded by Ray's)
            self.console.info(messages.waiting_min_workers_line(after, min_workers))
            self._check_parent_stop()
            _, after, more = self.workers.resize([], min_workers, wait_s=10.0)
            waited += more
            timeout = self.spec.group_spec.placement_timeout_s
            if timeout is not None and waited >= timeout:
                raise TimeoutError(
                    f"the elastic group stayed below min_workers={min_workers} for "
                    f"{waited:.0f} s (placement_timeout_s={timeout})"
                )
        self.console.info(messages.resize_line(reason, before, after, seconds + waited))

    def _rollback(self, state: RollingBackState) -> ControllerState:
        """Stop the ranks (their processes stay) and restart them from an earlier checkpoint."""
        fired = state.fired
        limit = self.spec.max_rollbacks
        reason = fired.rollback.reason
        if 0 <= limit <= self.rollbacks_so_far:
            text = messages.rollbacks_exhausted_text(fired.check, reason, fired.report.index, limit)
            self.console.info(f"giving up: {text}")
            self.book.end_attempt("errored", text)
            error = TrainConfigError(text)
            return ErroredState(self._failed_error(text, {-1: error}, self.failures_so_far))
        try:
            target = self._rollback_target(fired)
        except TrainConfigError as error:
            return ErroredState(self._failed_error(str(error), {-1: error}))
        self._rollback_fired_at = time.monotonic()
        self.metrics.flush()
        self.book.end_attempt("rolled_back", f"{fired.check}: {reason}")
        keep_group = self._wind_down(state)  # no rank writes any more
        after = -1 if target is None else target.report_index
        doomed = {r.dir_name for r in self.book.state.live_checkpoints() if r.report_index > after}
        if self.validations is not None:
            self.validations.cancel(doomed)
        record, dropped = self.book.rollback(
            fired.check, reason, fired.report.index, target, fired.report.metrics
        )
        self.book.delete_dropped(dropped)
        self.rollbacks_so_far += 1
        self._cleanup_needed = True  # uploads of the abandoned reports
        self.console.info(
            messages.rollback_line(
                fired.check,
                reason,
                fired.report.source,
                fired.report.index,
                target,
                record.rolled_back,
                self.rollbacks_so_far,
                limit,
            )
        )
        checkpoint = self.book.checkpoint(target) if target else None
        for cb in self.spec.callbacks:
            cb.on_restart(state.attempt + 1, checkpoint)
        return SchedulingState(attempt=state.attempt + 1, resume_from=target, keep_group=keep_group)

    def _rollback_target(self, fired: Fired) -> CheckpointRecord | None:
        """The named checkpoint, else the newest committed one before the bad report."""
        live = self.book.state.live_checkpoints()
        name = fired.rollback.target_name()
        if name is not None:
            for record in live:
                if record.dir_name == name:
                    return record
            raise TrainConfigError(
                f"health check {fired.check} returned Rollback(to_checkpoint={name!r}), "
                "which is not a committed checkpoint of this run that training can resume "
                f"from; those are: {[r.dir_name for r in live]}"
            )
        before = [r for r in live if r.report_index < fired.report.index]
        return max(before, key=lambda r: r.report_index) if before else None

    def _wind_down(self, state: RollingBackState) -> bool:
        """Stop every rank's training function, keeping the processes; False: start anew."""
        if self.workers.group is None:
            return False
        try:
            self.workers.replace_and_wind_down(
                sorted(state.dead_ranks), state.ended_ranks, self._world_size
            )
        except Exception as exc:
            self.console.info(messages.replace_failed_line(exc))
            return False
        return True

    def _finish(self) -> ControllerState:
        self.metrics.flush()
        self.book.end_attempt("finished", None)
        self.book.set_status("finished")
        result = self.book.result(dict(self.last_metrics))
        storage = self.spec.storage
        self.console.info(
            messages.finished_line(
                storage.name, self.metrics.next_index, self.book.latest(), storage.uri
            )
        )
        return FinishedState(result)

    def _finalize(self, state: ControllerState) -> Result:
        """Release the workers, record the outcome, call on_finish; return or raise."""
        if self.validations is not None:  # unfinished ones stay pending: they run on resume
            self._safe(self.validations.shutdown)
        released = self.workers.shutdown()
        callbacks = self.spec.callbacks
        if isinstance(state, FinishedState):
            for cb in callbacks:
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
            self._safe(lambda: self.book.set_status("errored"))
        else:
            assert isinstance(state, AbortedState)
            error = state.error
            self._safe(self.metrics.flush)
            self._safe(lambda: self.book.end_attempt("aborted", repr(error)))
            self._safe(lambda: self.book.set_status("aborted"))
            if isinstance(error, KeyboardInterrupt):
                why = "stopped by SIGTERM" if isinstance(error, DriverTerminated) else "interrupted"
                self.console.info(messages.interrupted_line(self.spec.storage.name, why))
        for cb in callbacks:
            self._safe(lambda cb=cb: cb.on_finish(None, error))  # type: ignore[misc]
        raise error

    # -- events -------------------------------------------------------------------------
    def _handle_event(self, event: Event) -> WorkerFailure | None:
        if isinstance(event, ReportEvent):
            return self._on_message(event)
        if isinstance(event, WorkerPreemptedEvent):
            self._on_preempted(event)
            return None
        if isinstance(event, FinishedEvent):
            self._running.discard(event.rank)
            if not self._collecting:  # a stopped rank cannot send what it did not report
                self._aggregate(lambda: self._reports.finished(event.rank))
            return None
        failure = failure_of(event, self.workers.node_of(event.rank))
        if failure is not None:
            self._running.discard(event.rank)
        return failure

    def _on_message(self, event: ReportEvent) -> WorkerFailure | None:
        decoded = decode(event.payload)
        if decoded is None:
            return None
        attempt, message = decoded
        if attempt != self._attempt:
            return None  # a late message of an attempt that already failed
        if isinstance(message, RankReport):
            self._on_report(event.rank, message)
            return None
        if message.error is not None:  # the rank's thread still runs: it is stopped later
            return upload_failure(event.rank, message.error, self.workers.node_of(event.rank))
        rank = event.rank
        for commit in self._aggregate(lambda: self._reports.uploaded(rank, message.index)):
            self._commit(commit)
        return None

    def _on_report(self, rank: int, report: RankReport) -> None:
        if rank == 0:
            self.metrics.add(report.index, report.metrics)
            self.last_metrics = report.metrics
            if self.health is not None:  # before the report can commit or reach a parent
                fired = self.health.on_report(
                    report.index, report.metrics, report.checkpoint_dir_name
                )
                if fired is not None:
                    raise _RollbackRequested(fired)
            if report.checkpoint_dir_name is None:
                self._deliver(report.metrics, None)
        for commit in self._aggregate(lambda: self._reports.add(rank, report)):
            self._commit(commit)

    def _aggregate(self, call: Callable[[], list[Commit] | None]) -> list[Commit]:
        try:
            return call() or []
        except CheckpointReportError as error:
            raise _RunIsBroken(error) from error

    def _commit(self, commit: Commit) -> None:
        self.metrics.flush()
        if commit.data_positions:  # written before the state names the checkpoint
            write_positions(
                self.spec.storage, commit.dir_name, commit.data_positions, self._world_size
            )
        config = self.spec.validation_config
        request = (
            config.request(commit.validation)
            if config is not None and commit.validation is not None
            else None
        )
        try:
            checkpoint, dropped = self.book.commit(
                commit.index, commit.dir_name, commit.metrics, request
            )
        except CheckpointReportError as error:
            raise _RunIsBroken(error) from error
        if request is not None:
            self._validator().submit(commit.index, commit.dir_name, checkpoint, request)
        # every rank learns the commit: SYNC ranks wait for it, the others read it later
        self.workers.current().send(commit_message(commit.index, commit.dir_name))
        self.book.delete_dropped(dropped)  # after the answer: a SYNC report does not wait
        self._at_boundary = True
        if 0 in commit.ranks:
            self._deliver(commit.metrics, checkpoint)

    def _deliver(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        for cb in self.spec.callbacks:
            cb.on_report(metrics, checkpoint)
        if self.spec.job_context is not None:  # a Tune trial records the checkpoint too
            self.spec.job_context.forward(metrics, checkpoint.uri if checkpoint else None)

    # -- validations --------------------------------------------------------------------
    def _validator(self) -> ValidationRunner:
        if self.validations is None:
            config = self.spec.validation_config
            assert config is not None
            make = self.spec.validation_launcher or (
                lambda c: RayValidationLauncher(c.fn, c.ray_remote_kwargs)
            )
            self.validations = ValidationRunner(make(config))
        return self.validations

    def _resubmit_validations(self) -> None:
        """Validations a previous driver left pending run again (or fail without a config)."""
        pending = self.book.pending_validations()
        if not pending:
            return
        if self.spec.validation_config is None:
            for r in pending:
                why = "this fit() has no validation_config, so it could not run again"
                self._on_validation(Outcome(r.report_index, r.dir_name, "failed", {}, why))
            return
        self.console.info(f"running {len(pending)} unfinished checkpoint validation(s) again")
        for r in pending:
            request = r.validation_request or {}
            self._validator().submit(r.report_index, r.dir_name, self.book.checkpoint(r), request)

    def _poll_validations(self, timeout_s: float) -> None:
        if self.validations is None:
            return
        for outcome in self.validations.poll(timeout_s):
            self._on_validation(outcome)

    def _on_validation(self, outcome: Outcome) -> None:
        record, dropped = self.book.record_validation(
            outcome.dir_name, outcome.status, outcome.metrics, outcome.error
        )
        if outcome.status != "validated":
            self.console.info(
                messages.validation_line(outcome.dir_name, outcome.status, outcome.error)
            )
        if self.workers.group is not None:  # get_all_reported_checkpoints(VALIDATED) waits
            self.workers.group.send(validated_message(outcome.index, outcome.status))
        self.book.delete_dropped(dropped)
        if record is None or record.rolled_back or outcome.status != "validated":
            return
        if self.health is not None:
            fired = self.health.on_validation(record.report_index, record.metrics, record.dir_name)
            if fired is not None:
                raise _RollbackRequested(fired)

    def _stored_history(self) -> list[dict[str, Any]]:
        """Rank 0's stored report history, which a resumed run's health checks start from."""
        if not self.spec.run_state.attempts:
            return []
        return self.spec.storage.read_metrics()

    def _check_parent_stop(self) -> None:
        ctx = self.spec.job_context
        if ctx is not None and ctx.stop_event.is_set():
            raise ctx.stop_error()

    # -- helpers ------------------------------------------------------------------------
    def _run_args(self, state: SchedulingState) -> WorkerRunArgs:
        resume = state.resume_from
        path, fs = self.spec.worker_storage
        return WorkerRunArgs(
            run_name=self.spec.storage.name,
            storage_path=path,
            filesystem=fs,
            attempt=state.attempt,
            report_index_base=resume.report_index + 1 if resume else 0,
            checkpoint_dir_name=resume.dir_name if resume else None,
            pass_config=self.spec.pass_config,
            committed_names=tuple(self.book.state.checkpoint_names()),
            # a fine-tuning start: only while the run has no committed checkpoint of its own
            starting_checkpoint=None if resume else self.spec.resume_from_checkpoint,
            has_validation=self.spec.validation_config is not None,
            rollback=self._rollback_info(resume),
            trial=trial_of(self.spec.job_context),
        )

    def _rollback_info(self, resume: CheckpointRecord | None) -> RollbackInfo | None:
        """The run's last rollback, while the attempt resumes from where it went back to."""
        rollbacks = self.book.state.rollbacks
        if not rollbacks or rollbacks[-1].to_checkpoint != (resume.dir_name if resume else None):
            return None
        last = rollbacks[-1]
        return RollbackInfo(
            from_report=last.from_report,
            to_checkpoint=last.to_checkpoint,
            to_report_index=last.to_report_index,
            reason=last.reason,
            check=last.check,
            number=last.number,
            metrics=dict(last.metrics),
        )

    def _begin_attempt(self, attempt: int, world_size: int, base: int) -> None:
        self._attempt = attempt
        self._world_size = world_size
        self._running = set(range(world_size))
        self._reports = ReportAggregator(world_size, self.book.state.checkpoint_names())
        self._stragglers = False
        self.metrics.rewind(base)  # rows from the resume point on are reported again
        self._said_waiting = False
        if self.health is not None:
            self.health.rewind(base)
        self.book.begin_attempt(attempt)

    def _delete_uncommitted(self) -> None:
        removed = self.book.delete_uncommitted()
        if removed:
            self.console.info(f"removed unfinished checkpoint upload(s) {removed}")

    def _safe(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # cleanup must not hide the run's own error
            self.console.warning(messages.cleanup_failed_line(exc))

    def _failed_error(
        self, message: str, worker_errors: dict[int, BaseException], failures: int = 0
    ) -> TrainingFailedError:
        name = self.spec.storage.name
        return TrainingFailedError(
            f"Training run {name!r} failed: {message}", worker_errors, failures
        )

    def _worker_errors(self, failures: list[WorkerFailure]) -> dict[int, BaseException]:
        workers = self.workers.workers
        return {
            f.rank: f.error
            if f.error is not None
            else RuntimeError(messages.describe_failure(f, workers))
            for f in failures
        }
