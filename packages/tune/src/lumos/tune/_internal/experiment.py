"""The experiment on storage: the Optuna study and the trial journal; create or restore.

Layout under ``{storage_path}/{name}/``::

    _lumos/run_state.json     experiment RunState (status, metric/mode)
    _lumos/study.journal      the Optuna study (Optuna journal format; optuna-dashboard opens it)
    _lumos/trials.journal     lumos trial events: starts, reports, errors, ends
    _lumos/lease.json         the live driver's lease
    trial_00000/              one directory per trial: _lumos/run_state.json + checkpoints

Restore: finished trials come back as they ended (not re-run); a trial that was
running when the driver died resumes from its latest committed checkpoint as
the same Optuna trial; enqueued trials not yet started stay queued.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.trial import TrialState

from lumos.storage import RunState, RunStorage, retried_isdir
from lumos.tune._internal import messages, optuna_bridge
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.journal import (
    STUDY_JOURNAL,
    FsJournal,
    StudyJournalBackend,
    StudyStorage,
)
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.pbt_runner import EXPLOIT_KEY, apply_exploit, exploit_from_checkpoint
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.study_outcome import tell_study
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import (
    TRIALS_JOURNAL,
    EndRecord,
    ReportRecord,
    StoredHistories,
    TrialEvents,
    TrialJournal,
)

logger = logging.getLogger("lumos.tune")

GRID_ATTR = "lumos:grid_index"


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs every told trial at INFO; keep the driver's console ours."""
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(previous)


@dataclass
class Experiment:
    """An opened experiment: storage, the study, the journals and the known trials."""

    storage: RunStorage
    study: optuna.Study
    study_journal: FsJournal
    trials_journal: TrialJournal
    trials: list[LiveTrial] = field(default_factory=list)
    resumed: bool = False
    waiting: int = 0
    grid_next: int = 0
    histories: StoredHistories = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Finished trials' reports, read back from the journal (LiveTrial.compact).
        self.histories = StoredHistories(self.trials_journal)

    def flush(self, force: bool = True) -> None:
        """Write buffered journal records: trial events first, then the study."""
        self.trials_journal.flush(force)
        self.study_journal.flush(force)

    def close(self) -> None:
        """Flush and close both journals."""
        self.trials_journal.close()
        self.study_journal.close()


def study_journal_path(storage: RunStorage) -> str:
    """Path of the Optuna study journal of an experiment."""
    return posixpath.join(storage.state_dir, STUDY_JOURNAL)


def open_study_storage(
    storage: RunStorage, writable: bool = True
) -> tuple[JournalStorage, FsJournal]:
    """The Optuna storage of an experiment (one writer at a time: the driver)."""
    journal = FsJournal(storage.fs, study_journal_path(storage), writable=writable)
    return StudyStorage(StudyJournalBackend(journal)), journal


def open_experiment(
    storage: RunStorage,
    space: SearchSpace,
    tune_config: TuneConfig,
) -> Experiment:
    """Create the experiment, or restore it when its study already exists.

    Raises:
        TuneConfigError: The stored study optimizes other directions than ``tune_config``.
    """
    optuna_storage, study_journal = open_study_storage(storage)
    trials_journal = TrialJournal(
        FsJournal(storage.fs, posixpath.join(storage.state_dir, TRIALS_JOURNAL))
    )
    with quiet_optuna():
        existing = [s.study_name for s in optuna_storage.get_all_studies()]
        if storage.name in existing:
            study = _load_study(storage, optuna_storage, tune_config)
            exp = Experiment(storage, study, study_journal, trials_journal, resumed=True)
            _restore(exp, space, tune_config)
            return exp
        study = _create_study(storage, optuna_storage, tune_config)
    exp = Experiment(
        storage,
        study,
        study_journal,
        trials_journal,
        waiting=len(tune_config.points_to_evaluate or []),
    )
    storage.save_state(
        RunState(
            name=storage.name,
            extra={"tune": {"metric": tune_config.metric, "mode": tune_config.mode}},
        )
    )
    exp.flush()
    return exp


def _sampler_and_pruner(
    tune_config: TuneConfig,
) -> tuple[optuna.samplers.BaseSampler, optuna.pruners.BasePruner]:
    sampler = tune_config.sampler or optuna.samplers.TPESampler()
    pruner = tune_config.pruner or optuna.pruners.NopPruner()
    return sampler, pruner


def _load_study(
    storage: RunStorage, optuna_storage: JournalStorage, tune_config: TuneConfig
) -> optuna.Study:
    sampler, pruner = _sampler_and_pruner(tune_config)
    study = optuna.load_study(
        study_name=storage.name, storage=optuna_storage, sampler=sampler, pruner=pruner
    )
    stored = [d.name.lower() for d in study.directions]
    directions = tune_config.directions()
    if stored != directions:
        raise TuneConfigError(
            f"experiment {storage.uri!r} was created with directions {stored} but "
            f"TuneConfig(metric={tune_config.metric!r}, mode={tune_config.mode!r}) "
            f"asks for {directions}; use the original metric/mode or a new "
            "RunConfig(name=...)"
        )
    return study


def _create_study(
    storage: RunStorage, optuna_storage: JournalStorage, tune_config: TuneConfig
) -> optuna.Study:
    sampler, pruner = _sampler_and_pruner(tune_config)
    study = optuna.create_study(
        study_name=storage.name,
        storage=optuna_storage,
        sampler=sampler,
        pruner=pruner,
        directions=tune_config.directions(),
    )
    if tune_config.metrics:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(tune_config.metrics)
    for point in tune_config.points_to_evaluate or []:
        study.enqueue_trial(dict(point))
    return study


def _restore(exp: Experiment, space: SearchSpace, tune_config: TuneConfig) -> None:
    study = exp.study
    by_number = exp.trials_journal.replay()
    grid_max = -1
    for frozen in study.get_trials(deepcopy=False):
        grid_index = frozen.user_attrs.get(GRID_ATTR)
        if isinstance(grid_index, int):
            grid_max = max(grid_max, grid_index)
        if frozen.state == TrialState.WAITING:
            exp.waiting += 1
            continue
        events = by_number.get(frozen.number, TrialEvents())
        config = _config_of(space, frozen.params)
        trial = LiveTrial.from_record(frozen, events, config, exp.storage)
        trial.attempt = events.starts
        for record in events.exploits:
            apply_exploit(trial, record)  # the config; checkpoints come after the reports
        if events.end is not None or frozen.state.is_finished():
            _restore_finished(exp, trial, frozen, events, tune_config)
        else:
            _restore_unfinished(exp, trial, frozen, events)
        exp.trials.append(trial)
    exp.grid_next = grid_max + 1


def _config_of(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    try:
        return space.config_from_params(params)
    except Exception:
        logger.debug("could not rebuild a config from %r", params, exc_info=True)
        return dict(params)


def _apply_reports(trial: LiveTrial, reports: list[ReportRecord]) -> None:
    _replay(trial, reports)
    for record in trial.exploits:
        if record.step >= trial.checkpoint_iteration:
            trial.checkpoint_dir = record.checkpoint_dir
            trial.checkpoint_iteration = record.step


def _replay(trial: LiveTrial, reports: list[ReportRecord]) -> None:
    """Replay reports; a report of an iteration already seen (a retry or an exploit
    resumed from an earlier checkpoint) replaces that iteration and those after it."""
    for rec in reports:
        if trial.history and rec.iteration <= trial.iteration:
            trial.history = [
                r for r in trial.history if int(r.get(ITERATION_KEY, 0)) < rec.iteration
            ]
        trial.apply_report(rec.iteration, rec.metrics, rec.checkpoint_dir)


def _end_status(end: EndRecord | None, state: TrialState) -> TrialStatus:
    if end is not None:
        return end.status
    if state == TrialState.PRUNED:
        return TrialStatus.PRUNED
    if state == TrialState.FAIL:
        return TrialStatus.ERROR
    return TrialStatus.TERMINATED


def _restore_finished(
    exp: Experiment,
    trial: LiveTrial,
    frozen: optuna.trial.FrozenTrial,
    events: TrialEvents,
    tune_config: TuneConfig,
) -> None:
    _apply_reports(trial, events.reports)
    trial.status = _end_status(events.end, frozen.state)
    if not frozen.state.is_finished():
        # The trial ended but the driver died before the study heard of it.
        tell_study(exp.study, trial, tune_config)
    # Population-based training reads donors' reports: its sweeps keep them in memory.
    trial.compact(
        exp.histories if tune_config.scheduler is None else None,
        optuna_bridge.stored_trial(exp.study, trial.number).params,
    )


def _restore_unfinished(
    exp: Experiment,
    trial: LiveTrial,
    frozen: optuna.trial.FrozenTrial,
    events: TrialEvents,
) -> None:
    trial_storage = exp.storage.child(trial.dir_name)
    try:
        state = trial_storage.load_state()
    except Exception:
        logger.warning(messages.unreadable_trial_state(trial.trial_name), exc_info=True)
        state = None
    latest = state.latest() if state is not None else None
    if latest is not None:
        missed = exploit_from_checkpoint(trial, latest)
        if missed is not None:  # the driver died before it journaled this exploit
            apply_exploit(trial, missed)
            exp.trials_journal.append(missed)
    upto = latest.report_index if latest is not None else 0
    _apply_reports(trial, [r for r in events.reports if r.iteration <= upto])
    if state is not None:
        exp.trials_journal.extend(_reports_from_checkpoints(trial, state, upto))
    trial.iteration = upto
    trial.checkpoint_dir = latest.dir_name if latest is not None else None
    trial.checkpoint_iteration = upto
    trial.status = TrialStatus.PENDING
    trial.optuna_trial = optuna_bridge.attach(exp.study, optuna_bridge.trial_id_of(frozen))
    trial.max_step_reported = max(frozen.intermediate_values, default=-1)
    _delete_uncommitted_checkpoints(trial_storage)


def _reports_from_checkpoints(trial: LiveTrial, state: RunState, upto: int) -> list[ReportRecord]:
    """Reports the journal missed (the driver died before its next flush) but whose
    checkpoints were committed: their records carry the reported metrics. They are
    applied to ``trial`` and returned, to be journaled."""
    out: list[ReportRecord] = []
    for rec in sorted(state.checkpoints, key=lambda r: r.report_index):
        if trial.iteration < rec.report_index <= upto and EXPLOIT_KEY not in rec.metrics:
            report = ReportRecord(trial.number, rec.report_index, dict(rec.metrics), rec.dir_name)
            trial.apply_report(report.iteration, report.metrics, report.checkpoint_dir)
            out.append(report)
    return out


def _delete_uncommitted_checkpoints(trial_storage: RunStorage) -> list[str]:
    """Remove ``checkpoint_*`` uploads no state names; return the names removed.

    Never removes a nested run's directory (a Train run in the trial writes to
    ``<trial_dir>/train/`` by default, or any name its ``RunConfig`` gives): every
    directory holding a ``_lumos/`` folder is a run and is reserved, whatever its
    name. Other non-checkpoint directories (user files) are kept too.
    """
    try:
        leftovers = trial_storage.list_uncommitted()
    except FileNotFoundError:
        return []
    nested = set(nested_run_dirs(trial_storage, leftovers))
    keep = [name for name in leftovers if name in nested or not name.startswith("checkpoint_")]
    if len(keep) == len(leftovers):
        return []
    return trial_storage.delete_uncommitted(reserved=keep)


def nested_run_dirs(storage: RunStorage, names: list[str]) -> list[str]:
    """The ``names`` (top-level directories of ``storage``) that are runs themselves.

    A run is a directory with a ``_lumos/`` state folder (see ``RunStorage.state_dir``).
    """
    out: list[str] = []
    for name in names:
        child = storage.child(name)
        try:
            if retried_isdir(child.fs, child.state_dir):
                out.append(name)
        except OSError:
            # Unknown: keep it (deleting a nested run loses its checkpoints).
            out.append(name)
    return out
