"""TrainController: the Ray backend's driver, a state machine of transitions only.

It lives in the process that calls ``fit()``; each state's handler returns the next
state::

    Initializing -> Scheduling -> Running -> Finished
                       ^            |  \\-> Aborted   (Ctrl-C, parent job stops it)
                       |            v
                       +------ Restarting -> Errored (FailurePolicy says RAISE)
                       |            |
                       +------ RollingBack -> Errored (max_rollbacks used up)
                       |       (a health check fired)
                       +------ Resizing (a checkpoint boundary: grow, or move preempted ranks)

The work is done by its collaborators:

* ``RunCore`` (core.py): the run's bookkeeping, the same as in local mode: the run
  book, the metrics, the attempt's report aggregator, the commit, finish and failure
  paths, and the components on the seam (seam.py): loader positions, validation,
  health checks and rollback.
* ``ElasticComponent`` (components/elastic.py): resizes and preemption moves.
* ``GroupDriver`` (group.py): starts, replaces and shuts down the worker group.
* The runtime's ``FailurePolicy`` and ``ResizePolicy`` decide; a decision explains itself.
* ``messages`` (messages.py): the text of every console line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lumos.runtime import (
    Event,
    FailureKind,
    FinishedEvent,
    FixedScalingPolicy,
    ReportEvent,
    WorkerFailure,
    WorkerPreemptedEvent,
)
from lumos.storage import StorageIOError
from lumos.train._internal.controller import attempt_log, messages
from lumos.train._internal.controller.components.elastic import ElasticComponent
from lumos.train._internal.controller.components.hang_watchdog import ray_hang_watchdog
from lumos.train._internal.controller.components.peer_recovery import PeerRecovery
from lumos.train._internal.controller.components.peer_resize import PeerResize
from lumos.train._internal.controller.core import RunCore
from lumos.train._internal.controller.failures import failure_of, upload_failure
from lumos.train._internal.controller.group import GroupDriver
from lumos.train._internal.controller.seam import RanksStuck, RunBroken, Verdict
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
from lumos.train._internal.errors import TrainingFailedError
from lumos.train._internal.session import run_train_worker
from lumos.train._internal.wire import RankReport, decode

if TYPE_CHECKING:
    from typing import Any

    from lumos.runtime import WorkerInfo
    from lumos.storage import WorkerRecord
    from lumos.train._internal.controller.run_book import EndedBy
    from lumos.train._internal.controller.spec import ControllerSpec
    from lumos.train._internal.result import Result

_DEAD = (FailureKind.ACTOR_DIED, FailureKind.HUNG)


@dataclass
class _Batch:
    """What a batch of worker events amounted to (the first verdict wins)."""

    failures: list[WorkerFailure] = field(default_factory=list)
    verdict: Verdict | None = None
    stragglers: bool = False  # a rank did not end within stop_grace_s

    def dead(self) -> frozenset[int]:
        return frozenset(f.rank for f in self.failures if f.kind in _DEAD)


class TrainController:
    """Drives one run from start to a terminal state (see the module docstring).

    Args:
        spec: What to run and with which collaborators.

    Attributes:
        state: The current state.
        history: Every state entered, in order (tests read it).
    """

    def __init__(self, spec: ControllerSpec) -> None:
        run = spec.run
        self.spec = spec
        self.console = run.console
        self.workers = GroupDriver(
            spec.group_factory,
            run.console,
            shutdown_grace_s=run.settings.shutdown_grace_s,
            stop_grace_s=run.settings.stop_grace_s,
        )
        group_spec = spec.group_spec
        self.elastic = ElasticComponent(
            self.workers,
            run.console,
            policy=spec.resize_policy,
            scaling=spec.scaling_policy or FixedScalingPolicy(group_spec.num_workers),
            interval_s=spec.resize_interval_s,
            min_workers=group_spec.min_workers or 1,
            placement_timeout_s=group_spec.placement_timeout_s,
        )
        peers = spec.backend.peer_recovery  # torchft: the group changes while ranks train
        resize = PeerResize(self.workers, self.elastic, run.console) if peers else None
        self.peer = PeerRecovery(self.workers, run.console, spec.failure_policy, peers, resize)
        extra = (self.elastic, self.peer, *ray_hang_watchdog(spec, self.workers))
        self.core = RunCore(run, spec.run_state, self._notify, extra=extra)
        self.state: ControllerState = InitializingState()
        self.history: list[ControllerState] = []
        self.failures_so_far = 0
        self._launched = False  # an attempt started under this driver

    def run(self) -> Result:
        """Run to a terminal state; return the result or raise the run's error."""
        try:
            while not self.state.terminal:
                self._transition(self._step(self.state))
        except StorageIOError as exc:  # permanent, or transient past the retry budget
            text = messages.storage_failed_text(exc)
            self._transition(ErroredState(self.core.failed_error(text, {-1: exc})))
        except BaseException as exc:  # Ctrl-C, a callback or the parent job raised
            self._transition(AbortedState(exc))
        return self._finalize(self.state)

    def _transition(self, new: ControllerState) -> None:
        if type(new) is not type(self.state):  # a state's own updates are not entries
            self.history.append(new)
        self.state = new

    def _step(self, state: ControllerState) -> ControllerState:
        if isinstance(state, InitializingState):
            return SchedulingState(self.core.book.attempts, self.core.start())
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
    def _schedule(self, state: SchedulingState) -> ControllerState:
        if self.core.training_done and self.workers.group is None:
            # Training finished under an earlier driver: finish what is left, no workers.
            self.core.begin_attempt(state.attempt, 0, state.resume_from)
            return RunningState(attempt=state.attempt)
        run = self.spec.run
        step = "start the workers"  # what failed, for the failure's message
        try:
            group = self.workers.group
            kept = state.keep_group and group is not None
            if not state.keep_group or group is None:
                group = self.workers.start(self.spec.group_spec)
            if state.cleanup:
                step = "remove the failed attempt's unfinished checkpoint uploads"
                self.core.delete_uncommitted()  # no rank is writing any more
            step = "set up the training backend on the workers"
            hooks = self.spec.backend.prepare_launch(group)
            step = "launch the training function on the workers"
            how = self._how_started(state, kept, group.workers)
            args = self.core.begin_attempt(
                state.attempt, len(group.workers), state.resume_from, how
            )
            group.launch(run_train_worker, args=(run.train_fn, run.config, args, hooks))
            self.peer.launched(run_train_worker, (run.train_fn, run.config, args), hooks)
        except Exception as exc:
            self.console.info(messages.launch_failed_line(exc))
            failure = WorkerFailure(
                rank=-1,
                kind=FailureKind.START_FAILED,
                message=messages.launch_failure_text(step, exc),
            )
            return RestartingState(failures=(failure,), attempt=state.attempt)
        seconds = time.monotonic() - state.since
        if state.after == "rollback":
            self.console.info(messages.rolled_back_line(state.resume_from, seconds))
        elif state.after == "resize":
            size = len(group.workers)
            self.console.info(messages.resumed_after_resize_line(size, state.resume_from, seconds))
        return RunningState(attempt=state.attempt)

    def _run_once(self, state: RunningState) -> ControllerState:
        core, attempt = self.core, self.core.attempt
        interval = self.spec.run.settings.poll_interval_s
        group = self.workers.group  # None: training finished under an earlier driver
        batch = self._handle(group.poll(interval if attempt.running else 0.0) if group else [])
        if batch.failures and batch.verdict is None:
            recovered = self.peer.recover(batch.failures, self.failures_so_far, core)
            if recovered is not None:  # replaced from a live peer: the others train on
                self.failures_so_far += 0 if recovered.preemption else 1
                batch = _Batch(verdict=recovered.verdict)
            else:
                batch = self._collect_other_endings(batch)
        if batch.verdict is None and not batch.failures:
            batch.verdict = core.idle(0.0 if attempt.running else interval)  # validations
        if batch.verdict is not None:
            return self._on_verdict(state, batch.verdict, batch.dead())
        stop = core.parent_stop()
        if stop is not None:
            return AbortedState(stop)
        core.tick()
        ended = frozenset(range(attempt.world_size)) - attempt.running
        if batch.failures:
            return RestartingState(tuple(batch.failures), state.attempt, ended, batch.stragglers)
        if attempt.running:
            joined = self.peer.step(core)  # torchft, elastic: ranks join while others train
            if joined is not None:
                return self._on_verdict(state, joined, frozenset())
            move = self.elastic.step()
            return state if move is None else ResizingState(move, state.attempt, ended)
        pending = core.outstanding()
        if not pending:
            return FinishedState(core.finish())
        if not state.said_waiting:
            core.training_finished(pending)
        return replace(state, said_waiting=True)

    def _on_verdict(
        self, state: RunningState, verdict: Verdict, dead: frozenset[int]
    ) -> ControllerState:
        if isinstance(verdict, RunBroken):
            return ErroredState(self.core.broken_error(verdict))
        attempt = self.core.attempt
        if isinstance(verdict, RanksStuck):  # torchft: only the stuck ranks are replaced
            recovered = self.peer.recover(verdict.failures, self.failures_so_far, self.core)
            if recovered is not None:
                self.failures_so_far += 1
                found = recovered.verdict
                return state if found is None else self._on_verdict(state, found, dead)
        if isinstance(verdict, RanksStuck):  # a failure: the stuck ranks' processes are
            # replaced (the others' collectives fail then); avoiding nodes needs a new group
            ended = frozenset(range(attempt.world_size)) - attempt.running
            new_group = self.spec.hang_avoid_node
            return RestartingState(verdict.failures, state.attempt, ended, stragglers=new_group)
        gone = frozenset(range(attempt.world_size)) - attempt.running - dead
        return RollingBackState(verdict.fired, state.attempt, ended_ranks=gone, dead_ranks=dead)

    def _restart(self, state: RestartingState) -> ControllerState:
        failures = list(state.failures)
        decision = self.elastic.lost_decision(failures)  # preempted ranks: their own budget
        preemption = decision is not None
        if decision is None:
            decision = self.spec.failure_policy.make_decision(failures, self.failures_so_far)
        self.core.attempt_failed(failures, decision, self.workers.workers, preemption)
        if not decision.should_retry:
            self.console.info(messages.giving_up_line(decision))
            errors = self._worker_errors(failures)
            error = self.core.failed_error(decision.reason, errors, self.failures_so_far)
            return ErroredState(error)
        if not preemption:
            self.failures_so_far += 1
        resume = self.core.book.latest()
        for f in failures:
            self.console.info(messages.describe_failure(f, self.workers.workers))
        self.console.info(messages.restarting_line(decision, resume))
        keep_group = self._reuse_group(state)
        self.core.restarting(resume)
        return SchedulingState(state.attempt + 1, resume, keep_group=keep_group, cleanup=True)

    def _reuse_group(self, state: RestartingState) -> bool:
        """Replace the failed ranks in the running group; False: start a new group."""
        if (
            self.spec.restart_strategy != "replace_failed"
            or self.workers.group is None
            or state.stragglers
            or any(f.rank < 0 for f in state.failures)
        ):
            return False
        dead = sorted({f.rank for f in state.failures if f.kind in _DEAD})
        if self.spec.group_spec.min_workers is not None:  # elastic: drop the lost ranks
            world = self.core.attempt.world_size
            return self.elastic.after_loss(dead, state.ended_ranks, world, self.core.parent_stop)
        return self._wind_down(dead, state.ended_ranks)

    def _rollback(self, state: RollingBackState) -> ControllerState:
        """Stop the ranks (their processes stay) and restart them from an earlier checkpoint."""
        plan = self.core.plan_rollback(state.fired, self.failures_so_far)
        if isinstance(plan, TrainingFailedError):
            return ErroredState(plan)
        keep_group = self._wind_down(sorted(state.dead_ranks), state.ended_ranks)
        resume = self.core.roll_back(plan)  # no rank writes any more
        return SchedulingState(
            state.attempt + 1,
            resume,
            keep_group=keep_group,
            cleanup=True,  # uploads of the abandoned reports
            after="rollback",
            since=plan.since,
        )

    def _resize(self, state: ResizingState) -> ControllerState:
        """At a checkpoint boundary: stop the ranks, grow or move the preempted ones."""
        since = time.monotonic()
        by: EndedBy = "preemption" if state.move.preempted else "resize"
        self.core.end_attempt("resized", state.move.reason, by)
        resume = self.core.book.latest()
        world = self.core.attempt.world_size
        keep = self.elastic.move(state.move, state.ended_ranks, world, self.core.parent_stop)
        stop = self.core.parent_stop()
        if stop is not None:
            return AbortedState(stop)
        return SchedulingState(
            state.attempt + 1, resume, keep_group=keep, after="resize", since=since
        )

    def _finalize(self, state: ControllerState) -> Result:
        """Release the workers, record the outcome, call on_finish; return or raise."""
        released = self.workers.shutdown()
        if isinstance(state, FinishedState):
            return self.core.close(state.result)
        assert isinstance(state, ErroredState | AbortedState)
        aborted = isinstance(state, AbortedState)
        raise self.core.close_failed(state.error, aborted=aborted, clean=released)

    # -- events -------------------------------------------------------------------------
    def _handle(self, events: list[Event], batch: _Batch | None = None) -> _Batch:
        batch = batch if batch is not None else _Batch()
        for event in events:
            if isinstance(batch.verdict, RunBroken):
                break  # the run ends: nothing else in the batch matters
            found = self._handle_event(event, batch)
            if isinstance(found, WorkerFailure):
                batch.failures.append(found)
            elif found is not None and batch.verdict is None:
                batch.verdict = found
        return batch

    def _handle_event(self, event: Event, batch: _Batch) -> WorkerFailure | Verdict | None:
        core = self.core
        if isinstance(event, ReportEvent):
            if batch.verdict is not None:
                return None  # the attempt is abandoned: only how ranks end still matters
            return self._on_message(event)
        if isinstance(event, WorkerPreemptedEvent):
            self.elastic.on_preempted(event)
            return None
        if isinstance(event, FinishedEvent):  # after a failure, the stopped ranks end
            return core.on_rank_ended(event.rank, returned=not batch.failures)
        failure = failure_of(event, self.workers.node_of(event.rank))
        if failure is not None:
            core.on_rank_ended(event.rank, returned=False)
        return failure

    def _on_message(self, event: ReportEvent) -> WorkerFailure | Verdict | None:
        decoded = decode(event.payload)
        if decoded is None:
            return None
        attempt, message = decoded
        if attempt != self.core.attempt.index:
            return None  # a late message of an attempt that already failed
        if isinstance(message, RankReport):
            return self.core.on_report(event.rank, message)
        if message.error is not None:  # the rank's thread still runs: it is stopped later
            return upload_failure(event.rank, message.error, self.workers.node_of(event.rank))
        return self.core.on_uploaded(event.rank, message.index)

    def _collect_other_endings(self, batch: _Batch) -> _Batch:
        """After a first failure: stop the other ranks and collect how each one ended.

        Every real error (not a ``StopRequested`` ending) joins the failures, so the
        failure policy and ``TrainingFailedError.worker_errors`` see all of them. Waits
        at most ``stop_grace_s``; a rank still running then makes the restart start a
        new group.
        """
        running = self.core.attempt.running
        if not running:
            return batch
        group = self.workers.current()
        group.request_stop()
        deadline = time.monotonic() + self.spec.run.settings.stop_grace_s
        while running and (remaining := deadline - time.monotonic()) > 0:
            if isinstance(batch.verdict, RunBroken):
                return batch
            batch = self._handle(group.poll(min(remaining, 1.0)), batch)
        batch.stragglers = bool(running)
        return batch

    # -- helpers ------------------------------------------------------------------------
    def _how_started(
        self, state: SchedulingState, kept: bool, workers: list[WorkerInfo]
    ) -> tuple[str, list[WorkerRecord]]:
        """How attempt ``state.attempt`` starts and where its ranks run (for its record)."""
        first, self._launched = not self._launched, True
        text = attempt_log.restart_text(
            state.attempt,
            first_launch=first,
            after=state.after,
            kept_group=kept,
            replaced=self.workers.replaced,
        )
        self.workers.replaced = []  # the next attempt's record says only its own
        return text, attempt_log.worker_records(workers)

    def _notify(self, message: tuple[Any, ...]) -> None:
        group = self.workers.group
        if group is not None:  # SYNC ranks wait for a commit notice, the others read it later
            group.send(message)

    def _wind_down(self, dead: list[int], ended: frozenset[int]) -> bool:
        """Stop every rank's training function, keeping the processes; False: start anew."""
        if self.workers.group is None:
            return False
        try:
            self.workers.replace_and_wind_down(dead, ended, self.core.attempt.world_size)
        except Exception as exc:
            self.console.info(messages.replace_failed_line(exc))
            return False
        return True

    def _worker_errors(self, failures: list[WorkerFailure]) -> dict[int, BaseException]:
        workers = self.workers.workers
        return {
            f.rank: f.error
            if f.error is not None
            else RuntimeError(messages.describe_failure(f, workers))
            for f in failures
        }
