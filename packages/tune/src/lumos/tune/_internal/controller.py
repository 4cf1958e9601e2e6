"""The driver loop: ask the study for trials, run them, feed reports to the pruner.

:class:`TuneController` owns every decision (start, prune, stop, retry, fail)
and talks to an executor (:class:`~lumos.tune._internal.executor.PoolExecutor`
over a real ``WorkerPool`` or the in-process fake), so the whole loop is unit
tested without Ray. The per-trial path is kept lean: journal records are
buffered and written once per loop iteration, the progress display refreshes
at most every few seconds, nothing is rendered per report.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from lumos.tune._internal.callbacks import Callback
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.errors import MetricNotReportedError, TrialError, TuneFailedError
from lumos.tune._internal.executor import Cancelled, Failed, Finished, Reported, TrialEvent
from lumos.tune._internal.experiment import GRID_ATTR, Experiment
from lumos.tune._internal.journal import finite_or_none
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.session import ITERATION_KEY, TrialSpec
from lumos.tune._internal.trial import Trial, TrialStatus

logger = logging.getLogger("lumos.tune")

# Stop reasons (Trial.stop_reason)
PRUNE = "pruned"
STOP = "stop"
TIME_BUDGET = "time_budget"
ABORT = "abort"


class Executor(Protocol):
    """What the controller needs from an executor (see ``PoolExecutor``)."""

    @property
    def num_running(self) -> int: ...

    def start(self, spec: TrialSpec) -> None: ...

    def stop(self, trial_id: str) -> list[TrialEvent]: ...

    def kill(self, trial_id: str) -> None: ...

    def waiting_for_resources(self) -> list[str]: ...

    def release_idle(self, keep: int) -> None: ...

    def poll(self, timeout_s: float | None) -> list[TrialEvent]: ...


class ProgressSink(Protocol):
    """Where the controller reports progress (console reporter or nothing)."""

    def update(self, trials: list[Trial], *, force: bool = False) -> None: ...

    def trial_done(self, trial: Trial) -> None: ...

    def waiting_for_resources(self, trials: list[Trial], resources: dict[str, float]) -> None: ...


class NullProgress:
    """Prints nothing."""

    def update(self, trials: list[Trial], *, force: bool = False) -> None:
        return None

    def trial_done(self, trial: Trial) -> None:
        return None

    def waiting_for_resources(self, trials: list[Trial], resources: dict[str, float]) -> None:
        return None


@dataclass
class ControllerSettings:
    """Run settings the controller needs besides TuneConfig."""

    max_concurrent_trials: int
    max_failures: int = 0
    stop_grace_s: float = 30.0
    progress_interval_s: float = 2.0
    resources_check_interval_s: float = 2.0
    journal_interval_s: float = 1.0


def tell_study(study: optuna.Study, number: int, trial: Trial, tune_config: TuneConfig) -> None:
    """Tell the study how ``trial`` ended (idempotent for already finished trials)."""
    target: optuna.Trial | int
    if trial.optuna_trial is not None:
        target = trial.optuna_trial  # asked (or re-attached) by this driver: still running
    else:
        frozen_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        if study._storage.get_trial(frozen_id).state.is_finished():
            return
        target = number
    if trial.status is TrialStatus.PRUNED:
        study.tell(target, state=TrialState.PRUNED)
    elif trial.status is TrialStatus.ERROR:
        study.tell(target, state=TrialState.FAIL)
    else:
        values = objective_values(trial, tune_config)
        if values is None:
            study.tell(target, state=TrialState.FAIL)
        else:
            study.tell(target, values)


def objective_values(trial: Trial, tune_config: TuneConfig) -> list[float] | None:
    """The trial's objective values: the last reported value of each metric."""
    metrics = tune_config.metrics
    if not metrics:
        return [0.0]
    values: list[float] = []
    for name in metrics:
        value = None
        for row in reversed(trial.history):
            if name in row:
                value = finite_or_none(row[name])
                break
        if value is None:
            return None
        values.append(value)
    return values


class TuneController:
    """Runs the sweep to its end; see the module docstring.

    Args:
        experiment: The opened experiment (study, journals, restored trials).
        space: The compiled search space.
        tune_config: The TuneConfig.
        executor: Runs trials.
        settings: Concurrency, retries, intervals.
        callbacks: User callbacks.
        progress: Console reporter.
        resources: The trial resources (for the "waiting for resources" message).
        clock: Monotonic clock (tests may pass a fake).
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
    ) -> None:
        self.exp = experiment
        self.study = experiment.study
        self.space = space
        self.config = tune_config
        self.executor = executor
        self.settings = settings
        self.callbacks = list(callbacks or [])
        self.progress: ProgressSink = progress or NullProgress()
        self.resources = dict(resources or {})
        self.clock = clock

        self.trials: list[Trial] = list(experiment.trials)
        self._by_id: dict[str, Trial] = {t.trial_id: t for t in self.trials}
        self._queue: deque[Trial] = deque(t for t in self.trials if t.status is TrialStatus.PENDING)
        self._running: dict[str, Trial] = {}
        self._metric = tune_config.metrics[0] if len(tune_config.metrics) == 1 else None
        pruner = tune_config.pruner
        self._pruning = pruner is not None and not isinstance(pruner, optuna.pruners.NopPruner)
        self._stop_dict = tune_config.stop if isinstance(tune_config.stop, dict) else None
        self._stop_fn = tune_config.stop if callable(tune_config.stop) else None
        self._target = (
            -1 if tune_config.num_samples == -1 else tune_config.num_samples * space.num_grid_points
        )
        self._created = len(self.trials)
        self._start = clock()
        self._stopping = False
        self._abort_error: BaseException | None = None
        self._stop_requested_at: dict[str, float] = {}
        self._dirty_end = False
        self._last_journal_flush = self._start
        self._last_progress = -math.inf
        self._last_resources_check = self._start
        self._waiting_announced: set[str] = set()

    # -- main loop -----------------------------------------------------------------------
    def run(self) -> list[Trial]:
        """Run until every trial ended; returns all trials (restored ones included).

        Raises:
            TuneFailedError: a trial failed and ``fail_fast`` is set.
            MetricNotReportedError: a trial never reported ``TuneConfig(metric=...)``.
        """
        try:
            while True:
                self._check_time_budget()
                self._fill()
                if not self._running:
                    break
                events = self.executor.poll(self._poll_timeout())
                for ev in events:
                    self._handle(ev)
                self._housekeeping()
        finally:
            self._flush(force=True)
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
        if self._stopping:
            return False
        return self._target == -1 or self._created < self._target

    def _fill(self) -> None:
        limit = self.settings.max_concurrent_trials
        while len(self._running) < limit and not self._stopping:
            if self._queue:
                trial = self._queue.popleft()
            elif self._can_create():
                trial = self._new_trial()
            else:
                break
            self._launch(trial)
        if not self._queue and not self._can_create():
            self.executor.release_idle(keep=0)

    def _new_trial(self) -> Trial:
        study = self.study
        if self.exp.waiting > 0:
            self.exp.waiting -= 1
        elif self.space.grid:
            index = self.exp.grid_next
            self.exp.grid_next += 1
            study.enqueue_trial(self.space.grid_params(index), user_attrs={GRID_ATTR: index})
        ot = study.ask()
        try:
            config = self.space.sample(ot)
        except BaseException:
            study.tell(ot, state=TrialState.FAIL)
            raise
        self._created += 1
        trial = Trial(
            number=ot.number,
            config=config,
            params=dict(ot.params),
            path=self.exp.storage.child(f"trial_{ot.number:05d}").uri,
            optuna_trial=ot,
        )
        self.trials.append(trial)
        self._by_id[trial.trial_id] = trial
        return trial

    def _launch(self, trial: Trial) -> None:
        trial.status = TrialStatus.RUNNING
        trial.stop_reason = None
        if not trial.start_time:
            trial.start_time = time.time()
        if trial.optuna_trial is None:
            trial.optuna_trial = optuna.Trial(self.study, self._frozen_id(trial.number))
        spec = TrialSpec(
            trial_id=trial.trial_id,
            trial_name=trial.trial_name,
            config=trial.config,
            attempt=trial.attempt,
            checkpoint_dir=trial.checkpoint_dir,
            start_iteration=trial.checkpoint_iteration if trial.checkpoint_dir else 0,
        )
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
        self.exp.trials_journal.append([{"e": "start", "n": trial.number, "a": trial.attempt}])
        self._dirty_end = True
        self.executor.start(spec)
        for cb in self.callbacks:
            cb.on_trial_start(trial)

    def _frozen_id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(
            self.study._study_id, number
        )

    # -- events ------------------------------------------------------------------------------
    def _handle(self, ev: TrialEvent) -> None:
        trial = self._running.get(ev.trial_id)
        if trial is None:
            return
        if isinstance(ev, Reported):
            self._on_report(trial, ev)
        elif isinstance(ev, Finished):
            self._on_finished(trial, ev)
        elif isinstance(ev, Failed):
            self._on_failed(trial, ev)
        elif isinstance(ev, Cancelled):
            self._on_cancelled(trial)

    def _on_cancelled(self, trial: Trial) -> None:
        # Stopped while waiting for a worker: it never ran. The study keeps it RUNNING,
        # so a later fit() of this experiment runs it.
        self._running.pop(trial.trial_id, None)
        self._stop_requested_at.pop(trial.trial_id, None)
        trial.status = TrialStatus.PENDING
        trial.optuna_trial = None

    def _on_report(self, trial: Trial, ev: Reported) -> None:
        metrics = ev.metrics
        trial.iteration = ev.iteration
        trial.last_result = metrics
        trial.history.append(metrics)
        trial.seen_metrics.update(metrics)
        if ev.checkpoint_dir is not None:
            trial.checkpoint_dir = ev.checkpoint_dir
            trial.checkpoint_iteration = ev.iteration
        self.exp.trials_journal.append(
            [{"e": "r", "n": trial.number, "i": ev.iteration, "m": metrics, "c": ev.checkpoint_dir}]
        )
        for cb in self.callbacks:
            cb.on_trial_result(trial, metrics)
        if trial.stop_reason is not None:
            return
        if self._pruning and self._metric is not None and trial.optuna_trial is not None:
            value = finite_or_none(metrics.get(self._metric))
            if value is not None:
                step = ev.iteration
                if step > trial.max_step_reported:
                    trial.optuna_trial.report(value, step)
                    trial.max_step_reported = step
                if trial.optuna_trial.should_prune():
                    self._request_stop(trial, PRUNE)
                    return
        if self._should_stop(trial, metrics):
            self._request_stop(trial, STOP)

    def _should_stop(self, trial: Trial, metrics: dict[str, Any]) -> bool:
        if self._stop_dict is not None:
            for key, bound in self._stop_dict.items():
                value = finite_or_none(metrics.get(key))
                if value is not None and value >= bound:
                    return True
        if self._stop_fn is not None:
            return bool(self._stop_fn(trial.trial_id, metrics))
        return False

    def _request_stop(self, trial: Trial, reason: str) -> None:
        if trial.stop_reason is not None:
            return
        trial.stop_reason = reason
        self._stop_requested_at[trial.trial_id] = self.clock()
        for ev in self.executor.stop(trial.trial_id):
            self._handle(ev)

    def _on_finished(self, trial: Trial, ev: Finished) -> None:
        if trial.stop_reason == PRUNE or (ev.pruned and trial.stop_reason is None):
            self._end(trial, TrialStatus.PRUNED)
            return
        if self._metric is not None and self._metric not in trial.seen_metrics:
            error = MetricNotReportedError(
                self._metric,
                trial.trial_name,
                sorted(k for k in trial.seen_metrics if k != ITERATION_KEY),
            )
            trial.errors.append(
                TrialError(trial.trial_name, trial.attempt, "MetricNotReportedError", str(error))
            )
            self._end(trial, TrialStatus.ERROR)
            self._abort(error)
            return
        for name in self.config.metrics:
            if name not in trial.seen_metrics:
                error = MetricNotReportedError(name, trial.trial_name, sorted(trial.seen_metrics))
                trial.errors.append(
                    TrialError(
                        trial.trial_name, trial.attempt, "MetricNotReportedError", str(error)
                    )
                )
                self._end(trial, TrialStatus.ERROR)
                self._abort(error)
                return
        self._end(trial, TrialStatus.TERMINATED)

    def _on_failed(self, trial: Trial, ev: Failed) -> None:
        trial.errors.append(ev.error)
        self.exp.trials_journal.append(
            [
                {
                    "e": "err",
                    "n": trial.number,
                    "a": trial.attempt,
                    "type": ev.error.exc_type,
                    "msg": ev.error.error_message,
                    "tb": ev.error.traceback,
                }
            ]
        )
        self._dirty_end = True
        if trial.stop_reason is not None and trial.stop_reason != ABORT:
            # It failed while being stopped: end it as the stop meant.
            status = TrialStatus.PRUNED if trial.stop_reason == PRUNE else TrialStatus.TERMINATED
            self._end(trial, status)
            return
        failures = len(trial.errors)
        max_failures = self.settings.max_failures
        if (
            not self._stopping
            and trial.stop_reason is None
            and (max_failures == -1 or failures <= max_failures)
        ):
            self._running.pop(trial.trial_id, None)
            trial.status = TrialStatus.PENDING
            trial.attempt += 1
            self._queue.appendleft(trial)
            logger.info(
                "trial %s failed (%s); retry %d of %s from %s",
                trial.trial_name,
                ev.error.exc_type,
                failures,
                "unlimited" if max_failures == -1 else max_failures,
                trial.checkpoint_dir or "the start",
            )
            return
        self._end(trial, TrialStatus.ERROR)
        if self.config.fail_fast and self._abort_error is None:
            self._abort(
                TuneFailedError(
                    f"trial {trial.trial_name!r} failed after {failures} attempt(s) and "
                    "TuneConfig(fail_fast=True) stops the sweep; set fail_fast=False to let "
                    "other trials go on, or raise RunConfig(failure_config=FailureConfig("
                    "max_failures=...)) to retry more",
                    [e for t in self.trials for e in t.errors if t.status is TrialStatus.ERROR],
                )
            )

    def _end(self, trial: Trial, status: TrialStatus) -> None:
        self._running.pop(trial.trial_id, None)
        trial.status = status
        trial.end_time = time.time()
        self._stop_requested_at.pop(trial.trial_id, None)
        tell_study(self.study, trial.number, trial, self.config)
        trial.optuna_trial = None
        self.exp.trials_journal.append([{"e": "end", "n": trial.number, "s": status.value}])
        self._dirty_end = True
        self.progress.trial_done(trial)
        for cb in self.callbacks:
            if status is TrialStatus.ERROR:
                cb.on_trial_error(trial)
            else:
                cb.on_trial_complete(trial)

    def _abort(self, error: BaseException) -> None:
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
        if budget is None or self._stopping:
            return
        if self.clock() - self._start >= budget:
            self._stopping = True
            logger.info("time budget of %.1fs is spent; stopping running trials", budget)
            for t in list(self._running.values()):
                self._request_stop(t, TIME_BUDGET)

    def _housekeeping(self) -> None:
        now = self.clock()
        # Trials that ignore a stop for too long are ended by removing their actor.
        for tid, asked in list(self._stop_requested_at.items()):
            if now - asked > self.settings.stop_grace_s and tid in self._running:
                trial = self._running[tid]
                self.executor.kill(tid)
                status = (
                    TrialStatus.PRUNED if trial.stop_reason == PRUNE else TrialStatus.TERMINATED
                )
                if trial.stop_reason == ABORT:
                    status = TrialStatus.ERROR if trial.errors else TrialStatus.TERMINATED
                self._end(trial, status)
        if self._dirty_end or now - self._last_journal_flush >= self.settings.journal_interval_s:
            self._flush(force=self._dirty_end)
        if now - self._last_resources_check >= self.settings.resources_check_interval_s:
            self._last_resources_check = now
            self._check_waiting()
        if now - self._last_progress >= self.settings.progress_interval_s:
            self._last_progress = now
            self.progress.update(self.trials)

    def _check_waiting(self) -> None:
        waiting_ids = set(self.executor.waiting_for_resources())
        newly: list[Trial] = []
        for tid, trial in self._running.items():
            was = trial.waiting_for_resources
            trial.waiting_for_resources = tid in waiting_ids
            if trial.waiting_for_resources and not was and tid not in self._waiting_announced:
                self._waiting_announced.add(tid)
                newly.append(trial)
        if newly:
            self.progress.waiting_for_resources(newly, self.resources)

    def _flush(self, force: bool) -> None:
        self.exp.flush(force=force)
        self._dirty_end = False
        self._last_journal_flush = self.clock()
