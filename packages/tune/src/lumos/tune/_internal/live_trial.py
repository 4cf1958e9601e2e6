"""The driver's live record of one trial (:class:`LiveTrial`), and how it shrinks once over.

The controller alone changes a :class:`LiveTrial`; everything outside the driver loop
sees a frozen :class:`~lumos.tune._internal.trial.Trial` from :meth:`LiveTrial.snapshot`.
A trial is made by the study's ask (:meth:`LiveTrial.new`) or from what the study and the
trial journal stored (:meth:`LiveTrial.from_record`); :meth:`LiveTrial.compact` shrinks a
finished one to its summary row (see :mod:`~lumos.tune._internal.trial_memory`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from typing import TYPE_CHECKING, Any

import optuna

from lumos.tune._internal.errors import TrialError, TrialErrorRecord
from lumos.tune._internal.trial import ExploitRecord, Trial, TrialStatus, trial_id, trial_name
from lumos.tune._internal.trial_memory import (
    RareField,
    SummaryRow,
    forget_defaults,
    rare_fields,
    same_dicts,
)
from lumos.tune._internal.trial_views import HistoryView

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from lumos.storage import RunStorage
    from lumos.tune._internal.trial_journal import TrialEvents

_name_of = trial_name  # (LiveTrial's attributes hide the two functions' names)
_id_of = trial_id


def _default_path(trial: LiveTrial) -> str:
    return f"{trial.path_prefix}/{trial.dir_name}"


def _default_dir_name(trial: LiveTrial) -> str:
    return _name_of(trial.number)


class LiveTrial:
    """The driver's mutable record of one trial (see :class:`Trial` for the fields).

    Only the controller (and the restore of an experiment) changes it. Slotted, and
    the fields most finished trials hold at their default live in one ``_more`` dict
    (None when all are defaults): a sweep of 10,000 trials keeps 10,000 of them.

    ``LiveTrial(number, config, params, path)`` is a new PENDING trial with every
    other field at its default; :meth:`new` and :meth:`from_record` are the driver's
    two ways to make one.
    """

    __slots__ = (
        "_more",
        "config",
        "end_time",
        "iteration",
        "last_result",
        "number",
        "params",
        "path_prefix",
        "rows",
        "start_time",
        "status",
        "stored_history",
        "stored_length",
        "trainable_name",
        "trial_id",
        "trial_name",
    )

    number: int
    config: dict[str, Any]
    params: dict[str, Any]
    trial_id: str
    trial_name: str
    status: TrialStatus
    last_result: Mapping[str, Any]
    rows: list[dict[str, Any]] | tuple[()]
    iteration: int
    start_time: float
    end_time: float
    trainable_name: str
    stored_history: Callable[[int], list[dict[str, Any]]] | None
    stored_length: int
    path_prefix: str
    _more: dict[str, Any] | None

    path = RareField[str]("", _default_path)
    dir_name = RareField[str]("", _default_dir_name)
    checkpoint_dir = RareField[str | None](None)
    checkpoint_iteration = RareField[int](0)
    attempt = RareField[int](0)
    errors = RareField[Sequence[TrialErrorRecord]](())
    stop_reason = RareField[str | None](None)
    waiting_for_resources = RareField[bool](False)
    optuna_trial = RareField[optuna.Trial | None](None)
    max_step_reported = RareField[int](-1)
    seen_metrics = RareField[AbstractSet[str]](frozenset())
    exploits = RareField[Sequence[ExploitRecord]](())

    def __init__(
        self, number: int, config: dict[str, Any], params: dict[str, Any], path: str
    ) -> None:
        self._more = None
        self.number = number
        self.config = config
        self.params = params
        self.path_prefix = ""
        default = _name_of(number)  # one string for both names
        self.trial_id = _id_of(number)
        self.trial_name = default
        self.dir_name = default
        self.path = path
        self.status = TrialStatus.PENDING
        self.last_result = {}
        self.rows = []
        self.iteration = 0
        self.start_time = 0.0
        self.end_time = 0.0
        self.trainable_name = ""
        self.stored_history = None
        self.stored_length = 0

    @classmethod
    def new(
        cls,
        optuna_trial: optuna.Trial,
        config: dict[str, Any],
        path: str,
        trainable_name: str = "",
    ) -> LiveTrial:
        """The trial the study just asked for: ``optuna_trial``, sampled as ``config``."""
        trial = cls(optuna_trial.number, config, dict(optuna_trial.params), path)
        trial.optuna_trial = optuna_trial
        trial.trainable_name = trainable_name
        return trial

    @classmethod
    def from_record(
        cls,
        frozen: FrozenTrial,
        events: TrialEvents,
        config: dict[str, Any],
        storage: RunStorage,
    ) -> LiveTrial:
        """A stored trial, from the study's ``frozen`` trial and the trial journal's
        ``events``: its number, params, names, directory in the experiment ``storage``
        and errors. Its status, attempts, reports and exploits are for the caller to
        replay (a restore and a read-only view count them differently)."""
        default = _name_of(frozen.number)
        name, dir_name = events.names or (default, default)
        trial = cls(frozen.number, config, dict(frozen.params), storage.child(dir_name).uri)
        trial.trial_name = name
        trial.dir_name = dir_name
        trial.errors = list(events.errors)
        return trial

    if not TYPE_CHECKING:  # (hidden from type checkers: it would accept any name)

        def __getattr__(self, name: str) -> str:
            # Only reached for a name slot that compact() left unset because it held
            # the default, rebuilt here (a 10,000-trial sweep keeps no copy of it).
            if name == "trial_id":
                return _id_of(self.number)
            if name == "trial_name":
                return _name_of(self.number)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def error(self) -> TrialErrorRecord | None:
        """The error that ended the trial (status ERROR), else None."""
        if self.status is TrialStatus.ERROR and self.errors:
            return self.errors[-1]
        return None

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every report, in order; read back from the trial journal (a new list at each
        access) for a finished trial whose reports :meth:`compact` dropped."""
        if self.stored_history is not None:
            return self.stored_history(self.number)
        return self.rows if isinstance(self.rows, list) else list(self.rows)

    @history.setter
    def history(self, rows: list[dict[str, Any]]) -> None:
        self.stored_history = None
        self.rows = rows

    def apply_report(
        self, iteration: int, metrics: dict[str, Any], checkpoint_dir: str | None
    ) -> None:
        """Count one report: the only place a report changes a trial (live or restored)."""
        if self.stored_history is not None:
            self.history = list(self.history)
        self.iteration = iteration
        self.last_result = metrics
        rows = self.rows if isinstance(self.rows, list) else list(self.rows)
        rows.append(metrics)
        self.rows = rows
        if not metrics.keys() <= self.seen_metrics:
            self.seen_metrics = self.seen_metrics | metrics.keys()
        if checkpoint_dir is not None:
            self.checkpoint_dir = checkpoint_dir
            self.checkpoint_iteration = iteration

    def compact(
        self,
        stored_history: Callable[[int], list[dict[str, Any]]] | None = None,
        study_params: dict[str, Any] | None = None,
    ) -> None:
        """Shrink a finished trial to its summary row (a 10,000-trial sweep keeps them
        all): forget the metric names seen (only checked when it ends), keep one dict
        for ``params`` and ``config`` when they are equal (flat search spaces), share
        the metric names of ``last_result`` with the other trials and, given
        ``stored_history`` (the trial journal's reader: number -> reports), drop its
        reports (the last stays as ``last_result``), read back when someone asks for
        them. Given the finished trial's ``study_params`` (its params as the Optuna study
        keeps them), ``params`` and ``config`` become that dict when all three are the
        same. Default names and paths are rebuilt when read, not kept. Nothing a
        snapshot or a result shows changes.

        Called once the trial's reports and end are in the journal's buffer (which is
        written before anyone hears of the end).
        """
        del self.seen_metrics, self.optuna_trial  # back to their defaults
        if study_params is not None and same_dicts(study_params, self.params, self.config):
            self.params = self.config = study_params
        elif self.params is not self.config and same_dicts(self.params, self.config):
            self.params = self.config
        self._forget_default_names()
        if stored_history is not None and self.stored_history is None and self.rows:
            self.stored_length = len(self.rows)
            self.rows = ()
            self.stored_history = stored_history
        if not self.rows:
            self.rows = ()
            self.last_result = SummaryRow.of(self.last_result)
        if not self.errors:
            self.errors = ()
        if not self.exploits:
            self.exploits = ()
        # (Only read while the trial runs and reports to Optuna.)
        del self.max_step_reported, self.waiting_for_resources
        forget_defaults(self, _RARE)

    def _forget_default_names(self) -> None:
        # (A default path and dir_name go with the other defaults in forget_defaults.)
        default = _name_of(self.number)
        if self.dir_name == default:
            prefix, _, tail = self.path.rpartition("/")
            if tail == default and prefix:
                self.path_prefix = sys.intern(prefix)  # one string for all trials
        if self.trial_name == default:
            del self.trial_name
        if self.trial_id == _id_of(self.number):
            del self.trial_id

    def history_view(self) -> HistoryView:
        """A read-only view of the reports so far (read back lazily once compacted)."""
        if self.stored_history is not None:
            return HistoryView(
                functools.partial(self.stored_history, self.number), self.stored_length
            )
        return HistoryView(self.rows if isinstance(self.rows, list) else [])

    def snapshot(self) -> Trial:
        """A frozen :class:`Trial` of the trial as it is now."""
        return Trial(
            number=self.number,
            trial_id=self.trial_id,
            trial_name=self.trial_name,
            config=dict(self.config),
            params=dict(self.params),
            path=self.path,
            status=self.status,
            last_result=dict(self.last_result),
            history=self.history_view(),
            checkpoint_dir=self.checkpoint_dir,
            iteration=self.iteration,
            attempt=self.attempt,
            errors=tuple(TrialError.from_record(e) for e in self.errors),
            stop_reason=self.stop_reason,
            waiting_for_resources=self.waiting_for_resources,
            start_time=self.start_time,
            end_time=self.end_time,
            exploits=tuple(self.exploits),
            dir_name=self.dir_name,
            trainable_name=self.trainable_name,
        )

    def __repr__(self) -> str:
        return f"LiveTrial({self.trial_name}, {self.status.value}, config={self.config!r})"


_RARE = rare_fields(LiveTrial)
