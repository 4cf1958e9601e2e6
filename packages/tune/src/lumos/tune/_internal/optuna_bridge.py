"""Every use of Optuna's private API in lumos.tune, in one place.

The driver re-attaches to trials it did not ``ask()`` in this process (a retry, or a
trial resumed after a driver crash) and checks a trial's stored state by number.
Optuna has no public API for either, so these few functions reach into
``Study._storage``, ``Study._study_id`` and ``FrozenTrial._trial_id``. Nothing else
in lumos.tune touches a ``_`` attribute of an Optuna object.

If an Optuna release renames one of them, the functions here raise
:class:`OptunaApiChangedError` naming the attribute and the installed Optuna version,
and ``tests/test_tune_optuna_bridge.py`` fails the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
import optuna.study._tell as _tell_module
from optuna.storages import BaseStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.trial import FrozenTrial, TrialState

from lumos.tune._internal.errors import TuneError

# (owner, attribute) pairs this module relies on; checked by ``check_private_api``.
PRIVATE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("optuna.Study", "_storage"),
    ("optuna.Study", "_study_id"),
    ("optuna.trial.FrozenTrial", "_trial_id"),
    ("optuna.storages.JournalStorage", "_replay_result"),
    ("optuna.storages.journal.JournalStorageReplayResult", "_trials"),
    ("optuna.study._tell", "_tell_with_warning"),
)


class OptunaApiChangedError(TuneError):
    """The installed Optuna no longer has a private attribute lumos.tune relies on."""

    def __init__(self, owner: str, attribute: str) -> None:
        self.owner = owner
        self.attribute = attribute
        super().__init__(
            f"lumos.tune relies on Optuna's private attribute {owner}.{attribute}, which "
            f"optuna {optuna.__version__} does not have; update lumos.tune's optuna_bridge "
            "module for this Optuna version (or install an Optuna version lumos-tune supports)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.owner, self.attribute))


def _private(obj: object, owner: str, attribute: str) -> Any:
    try:
        return getattr(obj, attribute)
    except AttributeError:
        raise OptunaApiChangedError(owner, attribute) from None


def _storage(study: optuna.Study) -> BaseStorage:
    storage: BaseStorage = _private(study, "optuna.Study", "_storage")
    return storage


def _study_id(study: optuna.Study) -> int:
    return int(_private(study, "optuna.Study", "_study_id"))


def trial_id_of_number(study: optuna.Study, number: int) -> int:
    """The storage id of the study's trial ``number``."""
    return _storage(study).get_trial_id_from_study_id_trial_number(_study_id(study), number)


def stored_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """The study's trial ``number`` as stored now (no copy of the other trials)."""
    return _storage(study).get_trial(trial_id_of_number(study, number))


def journal_trials(storage: object) -> dict[int, FrozenTrial]:
    """The in-memory trials (storage id -> trial) of an Optuna ``JournalStorage``."""
    replay = _private(storage, "optuna.storages.JournalStorage", "_replay_result")
    trials: dict[int, FrozenTrial] = _private(
        replay, "optuna.storages.journal.JournalStorageReplayResult", "_trials"
    )
    return trials


def tell(
    study: optuna.Study,
    trial: optuna.Trial | int,
    values: Sequence[float] | None = None,
    state: TrialState | None = None,
) -> None:
    """``study.tell(trial, values, state)`` without the deep copy of the told trial that
    ``Study.tell`` returns (and lumos drops): one copy per trial of the sweep."""
    tell_with_warning = _private(_tell_module, "optuna.study._tell", "_tell_with_warning")
    tell_with_warning(study=study, trial=trial, value_or_values=values, state=state)


def trial_id_of(frozen: FrozenTrial) -> int:
    """The storage id of a frozen trial."""
    return int(_private(frozen, "optuna.trial.FrozenTrial", "_trial_id"))


def attach(study: optuna.Study, trial_id: int) -> optuna.Trial:
    """A live ``optuna.Trial`` for a running trial of ``study`` (asked in another session)."""
    return optuna.Trial(study, trial_id)


def attach_number(study: optuna.Study, number: int) -> optuna.Trial:
    """A live ``optuna.Trial`` for the study's running trial ``number``."""
    return attach(study, trial_id_of_number(study, number))


class _NoLogs(BaseJournalBackend):
    """A journal backend kept in memory (for ``check_private_api``)."""

    def __init__(self) -> None:
        self._logs: list[dict[str, Any]] = []

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._logs.extend(logs)


def check_private_api() -> None:
    """Exercise every private attribute above on a throw-away in-memory study.

    Raises:
        OptunaApiChangedError: One of them is gone or changed meaning.
    """
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
        asked = study.ask()
        trial_id = trial_id_of_number(study, asked.number)
        frozen = stored_trial(study, asked.number)
        if frozen.number != asked.number or trial_id_of(frozen) != trial_id:
            raise OptunaApiChangedError("optuna.Study", "_storage")
        if attach_number(study, asked.number).number != asked.number:
            raise OptunaApiChangedError("optuna.trial.FrozenTrial", "_trial_id")
        tell(study, asked, [1.0])
        if not stored_trial(study, asked.number).state.is_finished():
            raise OptunaApiChangedError("optuna.study._tell", "_tell_with_warning")
        journal = optuna.storages.JournalStorage(_NoLogs())
        journaled = optuna.create_study(storage=journal)
        journaled.ask()
        if [t.number for t in journal_trials(journal).values()] != [0]:
            raise OptunaApiChangedError("optuna.storages.JournalStorage", "_replay_result")
    finally:
        optuna.logging.set_verbosity(previous)
