"""A stored experiment read back for the ``lumos`` command: trials, best trial, counts.

Read-only (the study and the trial journal are opened as readers), so it is safe
while the sweep's driver runs. The trials are rebuilt as the driver's
:class:`LiveTrial` records, so ``lumos show <sweep>`` prints the live table of
:mod:`progress` itself; the best trial is ``ResultGrid.get_best_result``'s.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from lumos.storage import RunStorage
from lumos.tune._internal.errors import TuneError
from lumos.tune._internal.experiment import (
    _apply_reports,
    _end_status,
    open_study_storage,
    quiet_optuna,
)
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.result import Result, ResultGrid
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import TRIALS_JOURNAL, TrialEvents, TrialJournal
from lumos.tune._internal.trial_views import snapshots


@dataclass
class SweepView:
    """What is stored of one experiment.

    Attributes:
        storage: The experiment's storage.
        trials: Its trials (not the enqueued ones), by number.
        metrics: The optimized metric names (empty when none was set).
        modes: Their modes, aligned with ``metrics``.
        waiting: Enqueued trials not started yet.
    """

    storage: RunStorage
    trials: list[LiveTrial]
    metrics: list[str]
    modes: list[str]
    waiting: int = 0

    def grid(self) -> ResultGrid:
        """The trials as a :class:`ResultGrid` (what ``Tuner.get_results()`` returns)."""
        results = [Result.from_trial(t, self.storage.fs) for t in snapshots(self.trials)]
        metric: str | list[str] | None = None
        mode: str | list[str] | None = None
        if len(self.metrics) == 1:
            metric, mode = self.metrics[0], self.modes[0]
        elif self.metrics:
            metric, mode = list(self.metrics), list(self.modes)
        return ResultGrid(results, metric=metric, mode=mode, experiment_path=self.storage.uri)

    def counts(self) -> dict[str, int]:
        """Trials per status (``TERMINATED``, ``PRUNED``, ``ERROR``, ...)."""
        return dict(Counter(t.status.value for t in self.trials))

    def best(self, metric: str | None = None, mode: str | None = None) -> LiveTrial | None:
        """The best finished trial by ``metric`` (default: the sweep's), or None.

        None also when the sweep optimizes several metrics and none is given, or
        when no finished trial reported a finite value.
        """
        if metric is None and len(self.metrics) != 1:
            return None
        try:
            result = self.grid().get_best_result(metric, mode)
        except TuneError:
            return None
        return next((t for t in self.trials if t.trial_name == result.trial_name), None)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def load_sweep(storage: RunStorage) -> SweepView:
    """Read the experiment stored at ``storage`` (never writes).

    Raises:
        TuneError: There is no study in it.
    """
    state = storage.load_state()
    tune_info = (state.extra.get("tune") if state is not None else None) or {}
    optuna_storage, _ = open_study_storage(storage, writable=False)
    journal = TrialJournal(
        FsJournal(storage.fs, posixpath.join(storage.state_dir, TRIALS_JOURNAL), writable=False)
    )
    with quiet_optuna():
        names = [s.study_name for s in optuna_storage.get_all_studies()]
        if storage.name not in names:
            raise TuneError(f"{storage.uri!r} holds no Optuna study named {storage.name!r}")
        study = optuna.load_study(study_name=storage.name, storage=optuna_storage)
        frozen_trials = study.get_trials(deepcopy=False)
    by_number = journal.replay()
    trials: list[LiveTrial] = []
    waiting = 0
    for frozen in frozen_trials:
        if frozen.state == TrialState.WAITING:
            waiting += 1
            continue
        events = by_number.get(frozen.number, TrialEvents())
        trial = LiveTrial.from_record(frozen, events, dict(frozen.params), storage)
        trial.attempt = max(events.starts - 1, 0)
        trial.exploits = list(events.exploits)
        if trial.exploits:
            trial.config = dict(trial.exploits[-1].new_config)
        _apply_reports(trial, events.reports)
        if events.end is not None or frozen.state.is_finished():
            trial.status = _end_status(events.end, frozen.state)
        else:
            trial.status = TrialStatus.RUNNING if events.starts else TrialStatus.PENDING
        if frozen.datetime_start is not None:
            trial.start_time = frozen.datetime_start.timestamp()
        if frozen.datetime_complete is not None:
            trial.end_time = frozen.datetime_complete.timestamp()
        trials.append(trial)
    trials.sort(key=lambda t: t.number)
    return SweepView(
        storage,
        trials,
        metrics=_as_list(tune_info.get("metric")),
        modes=_as_list(tune_info.get("mode")),
        waiting=waiting,
    )
