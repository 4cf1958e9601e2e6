"""The driver loop: ask the study for trials, run them, feed reports to the pruner.

:class:`TuneController` holds the sweep's state transitions (start, prune, stop,
retry, fail) and talks to an executor (:class:`~lumos.tune._internal.executor.PoolExecutor`
over a real ``WorkerPool`` or the in-process fake), so the whole loop is unit
tested without Ray. The rest is done elsewhere: :class:`TrialSource` makes new trials
(ask, sample, name), :class:`StopRules` (pruner and stop criteria) and
:class:`TrialFailures` (the runtime's failure policy, per trial) decide,
:class:`WaitingWatch` tells the console which trials wait for resources, the study
hears how trials end through :func:`tell_study`, and every event goes to the
:class:`TrialJournal`. The per-trial path is kept lean: journal records are buffered
and written once per loop iteration, the progress display refreshes at most every few
seconds, nothing is rendered per report.

Nothing acknowledged is lost: a trial end is in the journal before anyone hears of it
(the :class:`Outbox` holds callbacks and progress notifications until the batch's
ends are written, in one write or one object PUT). A driver killed at any point leaves
a journal that holds every trial end a callback, the console or a ``ResultGrid`` was
told of, so a restore never runs such a trial again.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable

from lumos.runtime import FailureDecision
from lumos.storage import Checkpoint
from lumos.tune._internal import messages, optuna_bridge
from lumos.tune._internal.callbacks import Callback, Hooks
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.controller_api import (
    ABORT,
    EXPLOIT,
    PRUNE,
    TIME_BUDGET,
    ControllerSettings,
    Executor,
    NullProgress,
    ProgressSink,
)
from lumos.tune._internal.errors import TrialErrorRecord
from lumos.tune._internal.executor import Cancelled, Failed, Finished, Reported, TrialEvent
from lumos.tune._internal.experiment import Experiment
from lumos.tune._internal.heap import HeapTrimmer
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.outbox import Outbox
from lumos.tune._internal.pbt_runner import PbtRunner
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.study_outcome import tell_study
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import EndRecord, ErrorRecord, ReportRecord, StartRecord
from lumos.tune._internal.trial_rules import StopRules, TrialFailures, fail_fast_error
from lumos.tune._internal.trial_source import TrialSource
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune._internal.trial_views import SnapshotsView
from lumos.tune._internal.waiting import WaitingWatch

__all__ = ["ControllerSettings", "TuneController"]

logger = logging.getLogger("lumos.tune")


class TuneController:
    """Runs the sweep to its end; see the module docstring.

    Args:
        experiment: The opened experiment (study, journals, restored trials).
        space: The compiled search space.
        tune_config: The TuneConfig.
        executor: Runs trials.
        settings: Concurrency, retries, intervals.
        callbacks: User callbacks (they get frozen :class:`~lumos.tune.Trial` snapshots).
        progress: Console reporter.
        resources: The trial resources (for the "waiting for resources" message).
        clock: Monotonic clock (tests may pass a fake).
        trainable_name: The trial function's name (``Trial.trainable_name``).
    """

    def __init__(
        self,
        experiment: Experiment,
        space: SearchSpace,
        tune_config: TuneConfig,
        executor: Executor,
        settings: ControllerSettings,
        callbacks: list[Callback] | None = None,
        progress: ProgressSink | None = None,
        resources: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        trainable_name: str = "",
    ) -> None:
        self.exp = experiment
        self.study = experiment.study
        self.space = space
        self.config = tune_config
        self.executor = executor
        self.settings = settings
        self.hooks = Hooks(list(callbacks or []), lambda: SnapshotsView(self.trials))
        self.progress: ProgressSink = progress or NullProgress()
        self.resources = dict(resources or {})
        self.clock = clock
        self.rules = StopRules(tune_config)
        self.failures = TrialFailures(settings.max_failures)
        self.pbt = PbtRunner.for_config(
            tune_config, experiment.storage, settings.retention, experiment.trials
        )
        self.trials: list[LiveTrial] = list(experiment.trials)
        self._source = TrialSource(experiment, space, tune_config, trainable_name)
        for t in self.trials:
            t.trainable_name = trainable_name
        self._queue: deque[LiveTrial] = deque(
            t for t in self.trials if t.status is TrialStatus.PENDING
        )
        self._running: dict[str, LiveTrial] = {}
        self._start = clock()
        self._stopping = False
        self._abort_error: BaseException | None = None
        self._stop_requested_at: dict[str, float] = {}
        self._dirty_end = False
        self._outbox = Outbox(functools.partial(self._flush, True))
        self._heap = HeapTrimmer(every=256)
        self._last_journal_flush = self._start
        self._last_progress = -math.inf
        self._last_resources_check = self._start
        self._waiting = WaitingWatch(executor, self.progress, self.resources)

    @property
    def callbacks(self) -> list[Callback]:
        """The user's callbacks (called through :class:`Hooks`)."""
        return self.hooks.callbacks

    @callbacks.setter
    def callbacks(self, callbacks: list[Callback]) -> None:
        self.hooks.callbacks = list(callbacks)

    # -- main loop -----------------------------------------------------------------------
    def run(self) -> list[LiveTrial]:
        """Run until every trial ended; returns all trials (restored ones included).

        Raises:
            TuneFailedError: a trial failed and ``fail_fast="raise"``.
            MetricNotReportedError: a trial never reported ``TuneConfig(metric=...)``.
        """
        try:
            while True:
                self._check_time_budget()
                self._fill()
                self._outbox.acknowledge()
                if not self._running:
                    break
                self.hooks.iteration += 1  # Ray's callback ``iteration``: driver loop steps
                for ev in self.executor.poll(self._poll_timeout()):
                    self._handle(ev)
                self._outbox.acknowledge()
                self._housekeeping()
        finally:
            self._flush(force=True)
            self._outbox.deliver()
        if self._abort_error is not None:
            raise self._abort_error
        return self.trials

    def _poll_timeout(self) -> float:
        timeout = self.settings.progress_interval_s
        if self.config.time_budget_s is not None and not self._stopping:
            remaining = self.config.time_budget_s - (self.clock() - self._start)
            timeout = min(timeout, max(remaining, 0.0))
        return max(timeout, 0.0)

    # -- starting trials -------------------------------------------------------------------
    def _can_create(self) -> bool:
        return not self._stopping and not self._source.exhausted

    def _fill(self) -> None:
        limit = self.settings.max_concurrent_trials
        while len(self._running) < limit and not self._stopping:
            if self._queue:
                trial = self._queue.popleft()
            elif self._can_create():
                trial = self._source.next()
                self.trials.append(trial)
            else:
                break
            self._launch(trial)
        if not self._queue and not self._can_create():
            self.executor.release_idle(keep=0)

    def _launch(self, trial: LiveTrial, *, record_start: bool = True) -> None:
        trial.status = TrialStatus.RUNNING
        trial.stop_reason = None
        if not trial.start_time:
            trial.start_time = time.time()
        if trial.optuna_trial is None:
            trial.optuna_trial = optuna_bridge.attach_number(self.study, trial.number)
        spec = TrialSpec(
            trial_id=trial.trial_id,
            trial_name=trial.trial_name,
            config=trial.config,
            attempt=trial.attempt,
            checkpoint_dir=trial.checkpoint_dir,
            start_iteration=trial.checkpoint_iteration if trial.checkpoint_dir else 0,
            dir_name=trial.dir_name,
            pbt_last_look=self.pbt.last_look(trial.trial_id) if self.pbt else 0.0,
            nested_run_name=f"train-pbt{len(trial.exploits)}" if trial.exploits else "train",
        )
        # History lists are replaced, never cut in place: snapshots taken earlier stay true.
        if trial.checkpoint_dir is None and trial.history:
            # A retry without a checkpoint starts over: its reports start over too.
            trial.history = []
            trial.iteration = 0
        elif trial.checkpoint_dir is not None:
            trial.history = [
                r for r in trial.history if int(r.get(ITERATION_KEY, 0)) <= spec.start_iteration
            ]
            trial.iteration = spec.start_iteration
        self._running[trial.trial_id] = trial
        if record_start:
            record = StartRecord(trial.number, trial.attempt, spec.start_iteration)
            self.exp.trials_journal.append(record)
            self._dirty_end = True
        self.executor.start(spec)
        if self.hooks:
            self._outbox.tell(functools.partial(self.hooks.trial_start, trial.snapshot()))

    # -- events ------------------------------------------------------------------------------
    def _handle(self, ev: TrialEvent) -> None:
        trial = self._running.get(ev.trial_id)
        if trial is None:
            return
        if isinstance(ev, Reported):
            self._on_report(trial, ev)
            if ev.awaiting:
                self.executor.answer(trial.trial_id, go=trial.stop_reason is None)
        elif isinstance(ev, Finished):
            self._on_finished(trial, ev)
        elif isinstance(ev, Failed):
            self._on_failed(trial, ev)
        elif isinstance(ev, Cancelled):
            self._on_cancelled(trial)

    def _on_cancelled(self, trial: LiveTrial) -> None:
        # Stopped while waiting for a worker: it never ran. The study keeps it RUNNING,
        # so a later fit() of this experiment runs it.
        self._running.pop(trial.trial_id, None)
        self._stop_requested_at.pop(trial.trial_id, None)
        trial.status = TrialStatus.PENDING
        trial.optuna_trial = None

    def _on_report(self, trial: LiveTrial, ev: Reported) -> None:
        if trial.stop_reason is not None:
            return  # reported after its last result (stop met, pruned, budget spent)
        trial.apply_report(ev.iteration, ev.metrics, ev.checkpoint_dir)
        self.exp.trials_journal.append(
            ReportRecord(trial.number, ev.iteration, ev.metrics, ev.checkpoint_dir)
        )
        if self.hooks:
            snapshot = trial.snapshot()
            self._outbox.tell(
                functools.partial(self.hooks.trial_result, snapshot, dict(ev.metrics))
            )
            if ev.checkpoint_dir is not None:
                checkpoint = Checkpoint(f"{trial.path}/{ev.checkpoint_dir}", self.exp.storage.fs)
                self._outbox.tell(functools.partial(self.hooks.checkpoint, snapshot, checkpoint))
        reason = self.rules.after_report(trial, ev.iteration, ev.metrics)
        pbt = self.pbt
        if reason is None and pbt and pbt.after_report(trial, ev.metrics, self.trials):
            self.executor.keep_worker(trial.trial_id)
            reason = EXPLOIT
        if reason is not None:
            self._request_stop(trial, reason)

    def _exploit(self, trial: LiveTrial) -> None:
        """The exploited trial stopped: clone its donor into it and relaunch it."""
        assert self.pbt is not None
        if self._stopping:  # the sweep ends: so does the trial
            self._forget_exploit(trial)
            self._end(trial, TrialStatus.TERMINATED)
            return
        self._running.pop(trial.trial_id, None)
        self._stop_requested_at.pop(trial.trial_id, None)
        trial.stop_reason = None
        record = self.pbt.execute(trial, {t.trial_id: t for t in self.trials})
        if record is not None:
            self.exp.trials_journal.append(record)
            self._flush(force=True)
        self._launch(trial, record_start=False)

    def _request_stop(self, trial: LiveTrial, reason: str) -> None:
        if trial.stop_reason is not None:
            return
        trial.stop_reason = reason
        self._stop_requested_at[trial.trial_id] = self.clock()
        for ev in self.executor.stop(trial.trial_id):
            self._handle(ev)

    def _on_finished(self, trial: LiveTrial, ev: Finished) -> None:
        if trial.stop_reason == EXPLOIT:
            if ev.pruned:
                self._exploit(trial)
                return
            trial.stop_reason = None  # it returned before it saw the stop: it is done
            self._forget_exploit(trial)
        if trial.stop_reason == PRUNE or (ev.pruned and trial.stop_reason is None):
            self._end(trial, TrialStatus.PRUNED)
            return
        missing = self.rules.missing_metric(trial)
        if missing is not None:
            trial.errors = [
                *trial.errors,
                TrialErrorRecord(
                    trial.trial_name, trial.attempt, "MetricNotReportedError", str(missing)
                ),
            ]
            self._end(trial, TrialStatus.ERROR)
            self._abort(missing)
            return
        self._end(trial, TrialStatus.TERMINATED)

    def _forget_exploit(self, trial: LiveTrial) -> None:
        if self.pbt is not None:
            self.pbt.drop(trial.trial_id)
        self._stop_requested_at.pop(trial.trial_id, None)

    def _on_failed(self, trial: LiveTrial, ev: Failed) -> None:
        if trial.stop_reason == EXPLOIT:
            trial.stop_reason = None  # a failure like any other: retried per FailureConfig
            self._forget_exploit(trial)
        trial.errors = [*trial.errors, ev.error]
        self.exp.trials_journal.append(ErrorRecord(trial.number, ev.error))
        self._dirty_end = True
        if trial.stop_reason is not None and trial.stop_reason != ABORT:
            # It failed while being stopped: end it as the stop meant.
            status = TrialStatus.PRUNED if trial.stop_reason == PRUNE else TrialStatus.TERMINATED
            self._end(trial, status)
            return
        decision = self.failures.decide(trial)
        if decision.should_retry and not self._stopping and trial.stop_reason is None:
            self._retry(trial, decision)
            return
        self._end(trial, TrialStatus.ERROR)
        if self.config.fail_fast == "raise" and self._abort_error is None:
            self._abort(fail_fast_error(trial, decision, self.trials))
        elif self.config.fail_fast and not self._stopping:
            logger.info(messages.fail_fast_stop(trial.trial_name))
            self._abort(None)  # Ray's fail_fast=True: the sweep ends, fit() returns

    def _retry(self, trial: LiveTrial, decision: FailureDecision) -> None:
        self._running.pop(trial.trial_id, None)
        trial.status = TrialStatus.PENDING
        trial.attempt += 1
        self._queue.appendleft(trial)
        logger.info(messages.trial_retried(trial.trial_name, decision.reason, trial.checkpoint_dir))

    def _end(self, trial: LiveTrial, status: TrialStatus) -> None:
        self._running.pop(trial.trial_id, None)
        trial.status = status
        trial.end_time = time.time()
        self._stop_requested_at.pop(trial.trial_id, None)
        tell_study(self.study, trial, self.config)
        trial.optuna_trial = None
        self.exp.trials_journal.append(EndRecord(trial.number, status))
        # Told only once the end is in the journal (see the module docstring).
        self._outbox.after_end(functools.partial(self.progress.trial_done, trial))
        if self.hooks:
            failed = status is TrialStatus.ERROR
            self._outbox.tell(
                functools.partial(self.hooks.trial_end, trial.snapshot(), failed=failed)
            )
        # Its summary row stays; its reports are read back from the journal when asked
        # for (population-based training reads donors' reports: it keeps them).
        trial.compact(
            self.exp.histories if self.pbt is None else None,
            optuna_bridge.stored_trial(self.study, trial.number).params,
        )
        self._heap.note()  # what the trial's run freed goes back to the OS

    def _abort(self, error: BaseException | None) -> None:
        if self._abort_error is None:
            self._abort_error = error
        self._stopping = True
        for t in list(self._running.values()):
            self._request_stop(t, ABORT)
        # Queued retries/resumes will not run in this session.
        self._queue.clear()

    # -- periodic work --------------------------------------------------------------------
    def _check_time_budget(self) -> None:
        budget = self.config.time_budget_s
        if self._stopping:
            return
        if budget is not None and self.clock() - self._start >= budget:
            logger.info(messages.time_budget_spent(budget))
        elif self.rules.stop_all():
            logger.info(messages.STOP_ALL)
        else:
            return
        self._stopping = True
        for t in list(self._running.values()):
            self._request_stop(t, TIME_BUDGET)

    def _housekeeping(self) -> None:
        now = self.clock()
        self._kill_overdue(now)
        self._outbox.acknowledge()
        if self._dirty_end or now - self._last_journal_flush >= self.settings.journal_interval_s:
            self._flush(force=self._dirty_end)
        if now - self._last_resources_check >= self.settings.resources_check_interval_s:
            self._last_resources_check = now
            self._waiting.check(self._running)
        if now - self._last_progress >= self.settings.progress_interval_s:
            self._last_progress = now
            self.progress.update(self.trials)

    def _kill_overdue(self, now: float) -> None:
        # Trials that ignore a stop for too long are ended by removing their actor.
        for tid, asked in list(self._stop_requested_at.items()):
            if now - asked > self.settings.stop_grace_s and tid in self._running:
                trial = self._running[tid]
                self.executor.kill(tid)
                if trial.stop_reason == EXPLOIT:
                    self._exploit(trial)  # on a new actor
                    continue
                status = (
                    TrialStatus.PRUNED if trial.stop_reason == PRUNE else TrialStatus.TERMINATED
                )
                if trial.stop_reason == ABORT:
                    status = TrialStatus.ERROR if trial.errors else TrialStatus.TERMINATED
                self._end(trial, status)

    def _flush(self, force: bool) -> None:
        self.exp.flush(force=force)
        self._dirty_end = False
        self._last_journal_flush = self.clock()
