"""TrainController: runs one training run as an event-driven state machine.

It lives in the process that calls ``fit()`` and holds the state transitions
only; the work of each state is done by its collaborators::

    Initializing -> Scheduling -> Running -> Finished
                       ^            |  \\-> Aborted   (Ctrl-C, parent job stops it)
                       |            v
                       +------ Restarting -> Errored (FailurePolicy says RAISE)

* ``GroupDriver`` (group.py): starts, replaces and shuts down the worker group.
* ``ReportAggregator`` (reports.py): pure; turns the ranks' reports into commits.
* ``MetricsBuffer`` (metrics_buffer.py): rank 0's report rows into the history.
* ``RunBook`` (run_book.py): the stored run state (status, attempts, commits).
* ``messages`` (messages.py): the text of every console line.
* The runtime's ``FailurePolicy`` decides RETRY or RAISE; its decision explains itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.runtime import (
    Event,
    FailureKind,
    FinishedEvent,
    ReportEvent,
    WorkerFailure,
)
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.failures import failure_of, upload_failure
from lumos.train._internal.controller.group import GroupDriver
from lumos.train._internal.controller.metrics_buffer import MetricsBuffer
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.controller.run_book import RunBook
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
from lumos.train._internal.session import WorkerRunArgs, run_train_worker
from lumos.train._internal.wire import RankReport, commit_message, decode

if TYPE_CHECKING:
    from lumos.storage import Checkpoint
    from lumos.train._internal.controller.spec import ControllerSpec
    from lumos.train._internal.result import Result

_DEAD = (FailureKind.ACTOR_DIED, FailureKind.HUNG)


class _RunIsBroken(Exception):
    """The ranks use the report API in a way no retry can fix."""

    def __init__(self, error: CheckpointReportError) -> None:
        super().__init__(str(error))
        self.error = error


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
        self.last_metrics: dict[str, Any] = {}
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
        resume = self.book.latest()
        self.book.set_status("running")
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
        events = self.workers.current().poll(self.spec.settings.poll_interval_s)
        try:
            failures = self._handle_events(events)
            if failures:
                failures += self._collect_other_endings()
        except _RunIsBroken as broken:
            return ErroredState(self._failed_error(str(broken.error), {-1: broken.error}))
        self._check_parent_stop()
        self.metrics.maybe_flush()
        if failures:
            ended = set(range(self._world_size)) - self._running
            return RestartingState(
                failures=tuple(failures), attempt=state.attempt, ended_ranks=frozenset(ended)
            )
        if not self._running:
            return self._finish()
        return state

    def _handle_events(self, events: list[Event]) -> list[WorkerFailure]:
        failures = []
        for event in events:
            failure = self._handle_event(event)
            if failure is not None:
                failures.append(failure)
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
        decision = self.spec.failure_policy.make_decision(failures, self.failures_so_far)
        self.book.end_attempt("errored", "; ".join(f.message for f in failures))
        for cb in self.spec.callbacks:
            cb.on_failure(failures, decision.should_retry)
        if not decision.should_retry:
            self.console.info(messages.giving_up_line(decision))
            errors = self._worker_errors(failures)
            return ErroredState(self._failed_error(decision.reason, errors, self.failures_so_far))
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
        try:
            self.workers.replace_and_wind_down(dead, state.ended_ranks, self._world_size)
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
                self.console.info(messages.interrupted_line(self.spec.storage.name))
        for cb in callbacks:
            self._safe(lambda cb=cb: cb.on_finish(None, error))  # type: ignore[misc]
        raise error

    # -- events -------------------------------------------------------------------------
    def _handle_event(self, event: Event) -> WorkerFailure | None:
        if isinstance(event, ReportEvent):
            return self._on_message(event)
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
        try:
            checkpoint, dropped = self.book.commit(commit.index, commit.dir_name, commit.metrics)
        except CheckpointReportError as error:
            raise _RunIsBroken(error) from error
        # every rank learns the commit: SYNC ranks wait for it, the others read it later
        self.workers.current().send(commit_message(commit.index, commit.dir_name))
        self.book.delete_dropped(dropped)  # after the answer: a SYNC report does not wait
        if 0 in commit.ranks:
            self._deliver(commit.metrics, checkpoint)

    def _deliver(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        for cb in self.spec.callbacks:
            cb.on_report(metrics, checkpoint)
        if self.spec.job_context is not None:
            self.spec.job_context.report(metrics)

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
        )

    def _begin_attempt(self, attempt: int, world_size: int, base: int) -> None:
        self._attempt = attempt
        self._world_size = world_size
        self._running = set(range(world_size))
        self._reports = ReportAggregator(world_size, self.book.state.checkpoint_names())
        self._stragglers = False
        self.metrics.rewind(base)  # rows from the resume point on are reported again
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
