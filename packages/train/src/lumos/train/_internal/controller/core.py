"""RunCore: one Train run's bookkeeping, the same under every backend.

The Ray controller (``controller.py``) and local mode / torchrun (``local.py``) drive
the same core; it holds no Ray, no thread and no worker group. It owns the run book
(the stored run state), the metrics buffer, the attempt's report aggregator and the
components on the seam (``seam.py``): loader positions, validation, health checks and
rollback, plus what a backend adds (the Ray backend's elastic component). A backend
feeds it the ranks' messages and gets back a ``Verdict`` when the attempt must stop;
what it sends to its ranks goes through the ``notify`` it passed in.

**Commit** (one order, :meth:`RunCore._commit`): flush the metrics buffer; the
components' ``before_commit`` (loader positions are written into the checkpoint; the
validation request joins its record); ``RunBook.commit`` (the run state names the
checkpoint; retention picks what to drop, deleting nothing yet); ``report_committed``
(a requested validation is queued); the commit notice to every rank (a SYNC
``train.report()`` returns); the dropped checkpoints are deleted; rank 0's report
reaches the callbacks and a parent Tune trial.

**Finish** (:meth:`RunCore.finish`, then :meth:`RunCore.close`): once every rank
returned and no component has work outstanding, flush the metrics, end the attempt,
mark the run finished and build the ``Result``; then ``run_ending`` and the callbacks'
``on_finish``.

**Failure** (:meth:`RunCore.attempt_failed` for an attempt that is retried or given
up, :meth:`RunCore.close_failed` when the run ends with an error or a stop): every
step is guarded so that a failing cleanup never hides the run's own error — the
components' ``run_ending`` (pending validations stay pending for a resume), the
metrics flush, the attempt and run status (``errored`` or ``aborted``), the removal
of uploads that never committed (when no rank can write any more), the console line
of an interrupt, and the callbacks' ``on_finish(None, error)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from lumos.runtime import StopRequested
from lumos.train._internal.controller import attempt_log, messages
from lumos.train._internal.controller.components.health import (
    HealthComponent,
    RollbackPlan,
    rollback_info,
)
from lumos.train._internal.controller.components.positions import LoaderPositionsComponent
from lumos.train._internal.controller.components.validation import ValidationComponent
from lumos.train._internal.controller.metrics_buffer import MetricsBuffer
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.controller.run_book import AttemptStatus, EndedBy, RunBook
from lumos.train._internal.controller.seam import (
    Attempt,
    CommitDraft,
    Committed,
    Component,
    RunBroken,
    Validated,
    Verdict,
)
from lumos.train._internal.errors import (
    CheckpointReportError,
    TrainingFailedError,
    training_failed,
)
from lumos.train._internal.sigterm import is_termination
from lumos.train._internal.train_context import WorkerRunArgs, trial_of
from lumos.train._internal.wire import commit_message, validated_message

if TYPE_CHECKING:
    from lumos.runtime import FailureDecision, WorkerFailure, WorkerInfo
    from lumos.storage import Checkpoint, CheckpointRecord, RunState, WorkerRecord
    from lumos.train._internal.controller.health_monitor import Fired
    from lumos.train._internal.controller.spec import RunSpec
    from lumos.train._internal.controller.validations import Outcome
    from lumos.train._internal.result import Result
    from lumos.train._internal.wire import RankReport

Notify = Callable[[tuple[Any, ...]], None]
"""Sends a driver notice (``wire.py``) to every rank of the running attempt."""


class RunCore:
    """The bookkeeping of one run (see the module docstring).

    Args:
        run: What every backend shares.
        state: The run's state when ``fit()`` started (new, or loaded to resume).
        notify: Sends a notice to every rank (a no-op while no rank runs).
        extra: The backend's own components, after the built-in ones.

    Attributes:
        book: The stored run state.
        metrics: Rank 0's report rows on their way into the history.
        attempt: The current attempt (a placeholder before the first one).
        validation: The validation component.
        health: The health-check and rollback component.
        components: Every component, in the order their hooks run.
    """

    def __init__(
        self, run: RunSpec, state: RunState, notify: Notify, extra: Sequence[Component] = ()
    ) -> None:
        settings = run.settings
        self.run = run
        self.console = run.console
        self.book = RunBook(run.storage, state, run.retention)
        self.metrics = MetricsBuffer(
            run.storage.append_metrics,
            max_rows=settings.metrics_flush_rows,
            interval_s=settings.metrics_flush_interval_s,
        )
        self._notify = notify
        resumed = bool(state.attempts)  # a resumed run's checks start from its history
        self.validation = ValidationComponent(self, run.validation_config, run.validation_launcher)
        self.health = HealthComponent(
            self,
            run.health_checks,
            run.max_rollbacks,
            lambda: run.storage.read_metrics() if resumed else [],
        )
        self.components: tuple[Component, ...] = (
            LoaderPositionsComponent(run.storage),
            self.validation,
            self.health,
            *extra,
        )
        self.attempt = Attempt(-1, 0, 0, None, ReportAggregator(0))

    # -- RunHandle (what components use) --------------------------------------------------
    def notify(self, message: tuple[Any, ...]) -> None:
        """Send a notice to every rank."""
        self._notify(message)

    def validation_finished(self, outcome: Outcome) -> Verdict | None:
        """Store a validation's outcome (retention judges it now), tell the ranks
        (``get_all_reported_checkpoints(VALIDATED)`` waits for it) and the components."""
        record, dropped = self.book.record_validation(
            outcome.dir_name, outcome.status, outcome.metrics, outcome.error
        )
        if outcome.status != "validated":
            self.console.info(
                messages.validation_line(outcome.dir_name, outcome.status, outcome.error)
            )
        self.notify(validated_message(outcome.index, outcome.status))
        self.book.delete_dropped(dropped)
        return self._first(lambda c: c.validation_finished(Validated(outcome, record)))

    # -- a run and its attempts -------------------------------------------------------------
    def start(self) -> CheckpointRecord | None:
        """The run begins (or resumes): returns the checkpoint the first attempt resumes from."""
        self.book.settle_rollbacks()  # a rollback the previous driver did not finish
        self.validation.resubmit()
        resume = self.book.latest()
        self.book.set_status("running")
        storage = self.run.storage
        for cb in self.run.callbacks:
            cb.on_start(storage.name, storage.uri, self.run.config)
        return resume

    def begin_attempt(
        self, index: int, world_size: int, resume: CheckpointRecord | None,
        how: tuple[str | None, Sequence[WorkerRecord]] = (None, ()),
    ) -> WorkerRunArgs:  # fmt: skip
        """Attempt ``index`` starts on ``world_size`` ranks (``how``: how it started and
        where its ranks run, for its record); returns what every rank gets."""
        base = resume.report_index + 1 if resume else 0
        names = self.book.state.checkpoint_names()
        self.attempt = Attempt(
            index, world_size, base, resume, ReportAggregator(world_size, names, base),
            running=set(range(world_size)),
        )  # fmt: skip
        self.metrics.rewind(base)  # rows from the resume point on are reported again
        self.book.begin_attempt(index, *how)
        for c in self.components:
            c.attempt_started(self.attempt)
        if self.training_done:  # an attempt that only finishes what an earlier one left
            self.console.info(messages.training_done_line(self.outstanding()))
        run = self.run
        path, fs = run.worker_storage
        return WorkerRunArgs(
            run_name=run.storage.name,
            storage_path=path,
            filesystem=fs,
            attempt=index,
            report_index_base=base,
            checkpoint_dir_name=resume.dir_name if resume else None,
            pass_config=run.pass_config,
            committed_names=tuple(names),
            # a fine-tuning start: only while the run has no committed checkpoint of its own
            starting_checkpoint=None if resume else run.resume_from_checkpoint,
            has_validation=run.validation_config is not None,
            rollback=rollback_info(self.book.state, resume),
            trial=trial_of(run.job_context),
            training_done=self.training_done,
        )

    # -- the ranks' messages ------------------------------------------------------------------
    def on_report(self, rank: int, report: RankReport) -> Verdict | None:
        """A rank's ``train.report()``; rank 0's is checked before it can commit."""
        if rank == 0:
            if not self.attempt.reports.follows_peers:  # else: once complete (_aggregate)
                self.metrics.add(report.index, report.metrics)
            verdict = self._first(lambda c: c.report_received(report))
            if verdict is not None:
                return verdict
            if report.checkpoint_dir_name is None:
                self._deliver(report.metrics, None)
        return self._aggregate(lambda: self.attempt.reports.add(rank, report))

    def on_uploaded(self, rank: int, index: int) -> Verdict | None:
        """A rank's background (ASYNC) upload of report ``index`` finished."""
        return self._aggregate(lambda: self.attempt.reports.uploaded(rank, index))

    def on_rank_ended(self, rank: int, returned: bool) -> Verdict | None:
        """A rank's training function ended (``returned``: it returned, not stopped)."""
        self.attempt.running.discard(rank)
        if not returned:  # a stopped rank cannot send what it did not report
            return None
        reports = self.attempt.reports

        def finished() -> list[Commit]:
            reports.finished(rank)  # raises when a checkpoint waits for this rank
            return []

        return self._aggregate(finished)

    def rank_replaced(self, rank: int, joins: bool = True) -> Verdict | None:
        """Peer recovery: ``rank`` (maybe a new one) joins the running attempt while the others
        go on, or stays vacant (``joins=False``); reports stop waiting for it until it reports."""
        if joins:
            self.attempt.world_size = max(self.attempt.world_size, rank + 1)
            for c in self.components:
                c.rank_joined(rank)
        (self.attempt.running.add if joins else self.attempt.running.discard)(rank)
        return self._aggregate(lambda: self.attempt.reports.excuse(rank))

    def idle(self, timeout_s: float) -> Verdict | None:
        """Let the components poll their work (validations) for up to ``timeout_s``."""
        return self._first(lambda c: c.idle(timeout_s))

    def tick(self) -> None:
        """Once per driver loop: write buffered metrics that waited long enough."""
        self.metrics.maybe_flush()

    def outstanding(self) -> int:
        """Work the run waits for once every rank returned (validations)."""
        return sum(c.outstanding() for c in self.components)

    def parent_stop(self) -> BaseException | None:
        """The error to stop with when the parent job (a Tune trial) stopped the run."""
        ctx = self.run.job_context
        return ctx.stop_error() if ctx is not None and self._parent_stopped() else None

    def stopped_from_outside(self, error: BaseException) -> bool:
        """Whether ``error`` means a stop (Ctrl-C, a stop request, the parent job's)."""
        return self._parent_stopped() or isinstance(error, KeyboardInterrupt | StopRequested)

    # -- ending attempts --------------------------------------------------------------------
    def end_attempt(
        self, status: AttemptStatus, text: str | None, ended_by: EndedBy | None = None
    ) -> None:
        """Write the buffered metrics, then record how the attempt ended."""
        self.metrics.flush()
        self.book.end_attempt(status, text, ended_by=ended_by)

    def attempt_failed(
        self, failures: Sequence[WorkerFailure], decision: FailureDecision,
        workers: Sequence[WorkerInfo] = (), preempted: bool = False,
    ) -> None:  # fmt: skip
        """Record a failed attempt (each failure's rank, node and error type with it);
        the components and callbacks learn of it."""
        self.metrics.flush()
        records = attempt_log.failure_records(failures, workers, preempted=preempted)
        by = attempt_log.ended_by(failures, preempted)
        self.book.end_attempt("errored", "; ".join(f.message for f in failures), records, by)
        for c in self.components:
            c.worker_failed(failures, decision.should_retry)
        for cb in self.run.callbacks:
            cb.on_failure(list(failures), decision.should_retry)

    def restarting(self, resume: CheckpointRecord | None) -> None:
        """The next attempt will resume from ``resume`` (the callbacks' ``on_restart``)."""
        checkpoint = self.book.checkpoint(resume) if resume else None
        for cb in self.run.callbacks:
            cb.on_restart(self.attempt.index + 1, checkpoint)

    def plan_rollback(self, fired: Fired, failures: int = 0) -> RollbackPlan | TrainingFailedError:
        """End the attempt for the rollback ``fired`` asks for and return its plan; or,
        when no rollback is left (``max_rollbacks``, no earlier checkpoint), end it
        errored and return the run's error (``failures``: the failures so far)."""
        plan = self.health.plan(fired)
        if plan.error is not None:
            text = str(plan.error)
            self.console.info(messages.gave_up_line(text))
            self.end_attempt("errored", text)
            return self.failed_error(text, {-1: plan.error}, failures)
        self.end_attempt("rolled_back", plan.why, "rollback")
        return plan

    def roll_back(self, plan: RollbackPlan) -> CheckpointRecord | None:
        """Carry a rollback out once no rank writes any more; returns where to resume."""
        after = -1 if plan.target is None else plan.target.report_index
        live = self.book.state.live_checkpoints()
        doomed = {r.dir_name for r in live if r.report_index > after}
        for c in self.components:
            c.rolled_back(doomed)
        self.health.apply(plan)
        self.book.mark_training_finished(False)  # training goes on from the target
        self.restarting(plan.target)
        return plan.target

    # -- ending the run ---------------------------------------------------------------------
    @property
    def training_done(self) -> bool:
        """An earlier driver saw every rank return and only validations were left: a
        resumed run finishes those (an attempt of no ranks) without training again."""
        return self.book.training_finished

    def training_finished(self, pending: int) -> None:
        """Every rank returned with ``pending`` validations left: say so and record it."""
        self.console.info(messages.waiting_validations_line(pending))
        self.book.mark_training_finished(True)

    def finish(self) -> Result:
        """Every rank returned and nothing is outstanding: the run is finished. Its
        metrics are the history's last row, so a resumed run returns what an
        uninterrupted one does."""
        self.end_attempt("finished", None)
        if self.attempt.reports.follows_peers:  # a replaced rank's upload that never committed
            self.delete_uncommitted(announce=True)
        self.book.finish()
        result = self.book.result()
        storage = self.run.storage
        self.console.info(
            messages.finished_line(
                storage.name, self.metrics.next_index, self.book.latest(), storage.uri
            )
        )
        return result

    def close(self, result: Result) -> Result:
        """After :meth:`finish`: ``run_ending`` and the callbacks' ``on_finish``."""
        for c in self.components:
            self._safe(lambda c=c: c.run_ending(True))  # type: ignore[misc]
        for cb in self.run.callbacks:
            cb.on_finish(result, None)
        return result

    def close_failed(self, error: BaseException, *, aborted: bool, clean: bool) -> BaseException:
        """The run ends with ``error`` (see the module docstring); returns it to raise.

        Args:
            error: Why the run ends.
            aborted: It was stopped from outside (Ctrl-C, the parent job, a callback),
                not failed: the run's status is ``aborted``, else ``errored``.
            clean: No rank can write any more: remove the uploads that never committed
                (an aborted run may never be resumed, where restore would clean up).
        """
        for c in self.components:
            self._safe(lambda c=c: c.run_ending(False))  # type: ignore[misc]
        status: Literal["aborted", "errored"] = "aborted" if aborted else "errored"
        text = f"{type(error).__name__}: {error}"
        self._safe(lambda: self.end_attempt(status, text))
        self._safe(lambda: self.book.set_status(status))
        if clean:
            self._safe(lambda: self.delete_uncommitted(announce=True))
        if isinstance(error, KeyboardInterrupt):
            why = "stopped by SIGTERM" if is_termination(error) else "interrupted"
            self.console.info(messages.interrupted_line(self.run.storage.name, why))
        for cb in self.run.callbacks:
            self._safe(lambda cb=cb: cb.on_finish(None, error))  # type: ignore[misc]
        return error

    def delete_uncommitted(self, *, announce: bool = False) -> None:
        """Remove checkpoint directories no committed state names (no rank writes);
        ``announce``: say which on the console (at the run's end)."""
        removed = self.book.delete_uncommitted()
        if removed and announce:
            self.console.info(messages.removed_uploads_line(removed))

    def failed_error(
        self, message: str, worker_errors: dict[int, BaseException], failures: int = 0
    ) -> TrainingFailedError:
        """The ``TrainingFailedError`` of this run (a ``WorkerGroupError`` when a worker
        failed, else a ``ControllerError``)."""
        text = messages.run_failed_text(self.run.storage.name, message)
        return training_failed(text, worker_errors, failures)

    def broken_error(self, verdict: RunBroken) -> TrainingFailedError:
        """The ``TrainingFailedError`` of a run that cannot go on."""
        return self.failed_error(str(verdict.error), {-1: verdict.error})

    # -- helpers ------------------------------------------------------------------------
    def _aggregate(self, call: Callable[[], list[Commit]]) -> Verdict | None:
        try:
            commits = call()
        except CheckpointReportError as error:  # a misuse no retry can fix
            return RunBroken(error)
        for index, row in self.attempt.reports.take_rows():  # peer recovery: complete ones
            self.metrics.add(index, row)
        for commit in commits:
            verdict = self._commit(commit)
            if verdict is not None:
                return verdict
        return None

    def _commit(self, commit: Commit) -> Verdict | None:
        """The one commit order (see the module docstring)."""
        self.metrics.flush()
        draft = CommitDraft(commit, self.attempt)
        for c in self.components:
            c.before_commit(draft)
        request = draft.validation_request
        try:
            checkpoint, dropped = self.book.commit(
                commit.index, commit.dir_name, commit.metrics, request
            )
        except CheckpointReportError as error:
            return RunBroken(error)
        self.attempt.commits += 1
        committed = Committed(commit, checkpoint, request)
        for c in self.components:
            c.report_committed(committed)
        # every rank learns the commit: SYNC ranks wait for it, the others read it later
        self.notify(commit_message(commit.index, commit.dir_name))
        self.book.delete_dropped(dropped)  # after the notice: a SYNC report does not wait
        if 0 in commit.ranks:
            self._deliver(commit.metrics, checkpoint)
        return None

    def _deliver(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        for cb in self.run.callbacks:
            cb.on_report(metrics, checkpoint)
        ctx = self.run.job_context
        if ctx is not None:  # a Tune trial records the checkpoint too
            ctx.forward(metrics, checkpoint.uri if checkpoint else None)

    def _first(self, hook: Callable[[Component], Verdict | None]) -> Verdict | None:
        """Call ``hook`` on every component; the first verdict wins."""
        verdicts = [hook(c) for c in self.components]  # every hook runs
        return next((v for v in verdicts if v is not None), None)

    def _parent_stopped(self) -> bool:
        ctx = self.run.job_context
        return ctx is not None and ctx.stop_event.is_set()

    def _safe(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # cleanup must not hide the run's own error
            self.console.warning(messages.cleanup_failed_line(exc))
