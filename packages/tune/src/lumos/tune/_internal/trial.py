"""Trials: the driver's live record (:class:`LiveTrial`) and the frozen view callbacks get.

The controller alone changes a :class:`LiveTrial`. Callbacks, results and everything
outside the driver loop see a :class:`Trial`: a frozen snapshot taken when the hook
runs, so a callback can neither change the sweep's state nor see it change later.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

import optuna

from lumos.tune._internal.errors import TrialError, TrialErrorRecord


class TrialStatus(str, enum.Enum):
    """Where a trial is in its life."""

    PENDING = "PENDING"
    """Waiting to start (new, retried or resumed)."""
    RUNNING = "RUNNING"
    """Its function runs on an actor (or its actor waits for resources)."""
    TERMINATED = "TERMINATED"
    """Finished normally (or ended by a stop criterion / the time budget)."""
    PRUNED = "PRUNED"
    """Ended early by the pruner."""
    ERROR = "ERROR"
    """Failed after all retries."""

    @property
    def is_finished(self) -> bool:
        """Whether the trial is over."""
        return self in (TrialStatus.TERMINATED, TrialStatus.PRUNED, TrialStatus.ERROR)


def trial_name(number: int) -> str:
    """The deterministic directory name of trial ``number``."""
    return f"trial_{number:05d}"


def trial_id(number: int) -> str:
    """The short id of trial ``number``."""
    return f"{number:05d}"


_name_of = trial_name  # (LiveTrial's arguments hide the two functions' names)
_id_of = trial_id


class HistoryView(Sequence[dict[str, Any]]):
    """A read-only view of the first ``length`` reports of a trial (copies on access).

    The driver only appends to a trial's history (a retry replaces the list), so a
    prefix of it never changes: the view costs nothing to take. For a finished trial
    whose reports the driver no longer keeps (see :meth:`LiveTrial.compact`), ``rows``
    is a function that reads them back from the trial journal on first access.
    """

    __slots__ = ("_length", "_load", "_rows_")

    def __init__(
        self,
        rows: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]],
        length: int | None = None,
    ) -> None:
        if callable(rows):
            if length is None:
                raise ValueError("HistoryView(rows=<loader>) needs the length")
            self._load: Callable[[], list[dict[str, Any]]] | None = rows
            self._rows_: list[dict[str, Any]] = []
        else:
            self._load = None
            self._rows_ = rows
        self._length = len(rows) if length is None else length  # type: ignore[arg-type]

    @property
    def _rows(self) -> list[dict[str, Any]]:
        if self._load is not None:
            self._rows_ = self._load()
            self._load = None
        return self._rows_

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [dict(r) for r in self._rows[: self._length][index]]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("trial history index out of range")
        return dict(self._rows[index])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self._length):
            yield dict(self._rows[i])

    def __repr__(self) -> str:
        return f"HistoryView({list(self)!r})"


@dataclass(frozen=True)
class ExploitRecord:
    """Trial ``number`` cloned trial ``donor`` (population-based training).

    Attributes:
        number: The exploited trial.
        donor: The trial it cloned.
        step: The exploited trial's ``training_iteration`` at the clone; its reports
            go on from here.
        checkpoint_dir: The cloned checkpoint, committed in the exploited trial's directory.
        old_config: Its config before.
        new_config: Its config after (the donor's, perturbed).
        operations: What was done to each mutated parameter.
        donor_checkpoint: The donor's checkpoint that was copied.
    """

    number: int
    donor: int
    step: int
    checkpoint_dir: str
    old_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, Any] = field(default_factory=dict)
    donor_checkpoint: str = ""


@dataclass(frozen=True, eq=False)
class Trial:
    """One trial as callbacks and results see it: a frozen snapshot.

    Attributes:
        number: The Optuna trial number.
        trial_id: Short id (``"00007"``).
        trial_name: Directory name (``"trial_00007"``).
        config: The sampled config.
        params: The Optuna params (flat names).
        path: URL / local path of the trial's directory.
        status: A :class:`TrialStatus`.
        last_result: The last reported metrics.
        history: Every report, in order (read-only).
        checkpoint_dir: The latest committed checkpoint's directory name.
        iteration: Reports counted so far (``training_iteration``).
        attempt: 0 for the first run, then one more per retry.
        errors: Every error the trial raised (retried ones too), as ``TrialError``.
        stop_reason: Why the driver asked the trial to stop (``"pruned"``, ``"stop"``,
            ``"time_budget"``, ``"abort"``), if it did.
        waiting_for_resources: Its actor is created but not yet placed by Ray.
        start_time: When the trial first started (``time.time()``), 0 if never.
        end_time: When it ended, 0 while it has not.
        exploits: Every time population-based training made it clone another trial.
        dir_name: The trial's directory in the experiment (``trial_dirname_creator``'s).
        trainable_name: The trial function's name (Ray's ``Trial.trainable_name``).
    """

    number: int
    trial_id: str
    trial_name: str
    config: dict[str, Any]
    params: dict[str, Any]
    path: str
    status: TrialStatus
    last_result: dict[str, Any]
    history: Sequence[dict[str, Any]]
    checkpoint_dir: str | None
    iteration: int
    attempt: int
    errors: tuple[TrialError, ...]
    stop_reason: str | None
    waiting_for_resources: bool
    start_time: float
    end_time: float
    exploits: tuple[ExploitRecord, ...] = ()
    dir_name: str = ""
    trainable_name: str = ""

    @property
    def error(self) -> TrialError | None:
        """The error that ended the trial (status ERROR), else None."""
        if self.status is TrialStatus.ERROR and self.errors:
            return self.errors[-1]
        return None

    def __repr__(self) -> str:
        return f"Trial({self.trial_name}, {self.status.value}, config={self.config!r})"


_T = TypeVar("_T")


class _Rare(Generic[_T]):
    """A :class:`LiveTrial` field that most finished trials hold at its default: kept in
    the trial's ``_more`` dict (None once it holds only defaults), not in a slot of its
    own. A 10,000-trial sweep keeps 10,000 trials; each slot is 8 bytes of every one.

    ``default_of`` computes a default from the trial (a path from its name).
    """

    __slots__ = ("default", "default_of", "name")

    def __init__(self, default: _T, default_of: Callable[[LiveTrial], _T] | None = None) -> None:
        self.default = default
        self.default_of = default_of
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, trial: None, owner: type | None = None) -> _Rare[_T]: ...

    @overload
    def __get__(self, trial: LiveTrial, owner: type | None = None) -> _T: ...

    def __get__(self, trial: LiveTrial | None, owner: type | None = None) -> _T | _Rare[_T]:
        if trial is None:
            return self
        more = trial._more
        if more is not None:
            try:
                return more[self.name]  # type: ignore[no-any-return]
            except KeyError:
                pass
        return self.default_for(trial)

    def __set__(self, trial: LiveTrial, value: _T) -> None:
        if trial._more is None:
            trial._more = {self.name: value}
        else:
            trial._more[self.name] = value

    def __delete__(self, trial: LiveTrial) -> None:
        if trial._more is not None:
            trial._more.pop(self.name, None)

    def default_for(self, trial: LiveTrial) -> _T:
        """The field's default for ``trial``."""
        return self.default if self.default_of is None else self.default_of(trial)

    def is_default(self, trial: LiveTrial, value: Any) -> bool:
        default = self.default_for(trial)
        return value is default or (type(value) is type(default) and value == default)


def _default_path(trial: LiveTrial) -> str:
    return f"{trial.path_prefix}/{trial.dir_name}"


def _default_dir_name(trial: LiveTrial) -> str:
    return trial_name(trial.number)


class LiveTrial:
    """The driver's mutable record of one trial (see :class:`Trial` for the fields).

    Only the controller (and the restore of an experiment) changes it. Slotted, and
    the fields most finished trials hold at their default live in one ``_more`` dict
    (None when all are defaults): a sweep of 10,000 trials keeps 10,000 of them.
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

    path = _Rare[str]("", _default_path)
    dir_name = _Rare[str]("", _default_dir_name)
    checkpoint_dir = _Rare[str | None](None)
    checkpoint_iteration = _Rare[int](0)
    attempt = _Rare[int](0)
    errors = _Rare[Sequence[TrialErrorRecord]](())
    stop_reason = _Rare[str | None](None)
    waiting_for_resources = _Rare[bool](False)
    optuna_trial = _Rare[optuna.Trial | None](None)
    max_step_reported = _Rare[int](-1)
    seen_metrics = _Rare[AbstractSet[str]](frozenset())
    exploits = _Rare[Sequence[ExploitRecord]](())

    def __init__(
        self,
        number: int,
        config: dict[str, Any],
        params: dict[str, Any],
        path: str,
        trial_id: str = "",
        trial_name: str = "",
        status: TrialStatus = TrialStatus.PENDING,
        last_result: Mapping[str, Any] | None = None,
        rows: list[dict[str, Any]] | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_iteration: int = 0,
        iteration: int = 0,
        attempt: int = 0,
        errors: Sequence[TrialErrorRecord] = (),
        stop_reason: str | None = None,
        waiting_for_resources: bool = False,
        optuna_trial: optuna.Trial | None = None,
        max_step_reported: int = -1,
        seen_metrics: AbstractSet[str] = frozenset(),
        start_time: float = 0.0,
        end_time: float = 0.0,
        exploits: Sequence[ExploitRecord] = (),
        dir_name: str = "",
        trainable_name: str = "",
        stored_history: Callable[[int], list[dict[str, Any]]] | None = None,
        stored_length: int = 0,
        path_prefix: str = "",
    ) -> None:
        self._more = None
        self.number = number
        self.config = config
        self.params = params
        self.path_prefix = path_prefix
        default = _name_of(number)  # one string for both names
        self.trial_id = trial_id or _id_of(number)
        self.trial_name = trial_name or default
        self.dir_name = dir_name or default
        self.path = path
        self.status = status
        self.last_result = {} if last_result is None else last_result
        self.rows = [] if rows is None else rows
        self.iteration = iteration
        self.start_time = start_time
        self.end_time = end_time
        self.trainable_name = trainable_name
        self.stored_history = stored_history
        self.stored_length = stored_length
        rare = {
            "checkpoint_dir": checkpoint_dir,
            "checkpoint_iteration": checkpoint_iteration,
            "attempt": attempt,
            "errors": errors,
            "stop_reason": stop_reason,
            "waiting_for_resources": waiting_for_resources,
            "optuna_trial": optuna_trial,
            "max_step_reported": max_step_reported,
            "seen_metrics": seen_metrics,
            "exploits": exploits,
        }
        for name, value in rare.items():
            if not _RARE[name].is_default(self, value):
                setattr(self, name, value)

    if not TYPE_CHECKING:  # (hidden from type checkers: it would accept any name)

        def __getattr__(self, name: str) -> str:
            # Only reached for a name slot that compact() left unset because it held
            # the default, rebuilt here (a 10,000-trial sweep keeps no copy of it).
            if name == "trial_id":
                return trial_id(self.number)
            if name == "trial_name":
                return trial_name(self.number)
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
        if study_params is not None and _same(study_params, self.params, self.config):
            self.params = self.config = study_params
        elif self.params is not self.config and _same(self.params, self.config):
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
        self._forget_defaults()

    def _forget_defaults(self) -> None:
        """Drop the rare fields that hold their default (``_more`` None if all do)."""
        more = self._more
        if more is None:
            return
        for name, value in list(more.items()):
            if _RARE[name].is_default(self, value):
                del more[name]
        if not more:
            self._more = None

    def _forget_default_names(self) -> None:
        # (A default path and dir_name go with the other defaults in _forget_defaults.)
        default = trial_name(self.number)
        if self.dir_name == default:
            prefix, _, tail = self.path.rpartition("/")
            if tail == default and prefix:
                self.path_prefix = sys.intern(prefix)  # one string for all trials
        if self.trial_name == default:
            del self.trial_name
        if self.trial_id == trial_id(self.number):
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


_RARE: dict[str, _Rare[Any]] = {
    name: field_ for name, field_ in vars(LiveTrial).items() if isinstance(field_, _Rare)
}


def _same(first: dict[str, Any], *others: dict[str, Any]) -> bool:
    """Whether the dicts hold the same keys in the same order and equal values of the
    same types (so one can stand for the others)."""
    for other in others:
        if other is first:
            continue
        if list(other) != list(first):
            return False
        for key, value in first.items():
            theirs = other[key]
            if theirs is not value and (type(theirs) is not type(value) or theirs != value):
                return False
    return True


class SummaryRow(Mapping[str, Any]):
    """A finished trial's last metrics, read-only and small: a 10,000-trial sweep keeps
    one per trial.

    All rows with the same metric names share one class (made on first use) that
    holds the names and keeps each value in a slot: an object of 32 bytes plus 8 per
    value, against a dict's 184 or more. Past 256 sets of names (names that change
    from trial to trial), a row keeps its names in a tuple beside the values.

    Example:
        >>> row = SummaryRow.of({"loss": 0.5, "training_iteration": 3})
        >>> row["loss"], dict(row)
        (0.5, {'loss': 0.5, 'training_iteration': 3})
    """

    __slots__ = ()

    _names: tuple[Any, ...]  # (the class's for a slotted row, the row's own for a tuple row)

    _MAX_CLASSES: ClassVar[int] = 256
    _classes: ClassVar[dict[tuple[Any, ...], type[_SlottedRow]]] = {}

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> SummaryRow:
        """The row of ``metrics``."""
        if isinstance(metrics, SummaryRow):
            return metrics
        names = tuple(metrics)
        row_class = SummaryRow._classes.get(names)
        if row_class is None:
            if len(SummaryRow._classes) >= SummaryRow._MAX_CLASSES:
                return _TupleRow(names, tuple(metrics.values()))
            row_class = SummaryRow._classes[names] = _SlottedRow.for_names(names)
        row = row_class.__new__(row_class)
        for slot, value in zip(row_class._slots, metrics.values(), strict=True):
            slot.__set__(row, value)
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (SummaryRow.of, (dict(self),))


class _SlottedRow(SummaryRow):
    """A :class:`SummaryRow` whose class holds the names; the values are in slots."""

    __slots__ = ()

    _names = ()
    _index: ClassVar[dict[Any, int]] = {}
    _slots: ClassVar[tuple[Any, ...]] = ()  # the slots' member descriptors, in order

    @staticmethod
    def for_names(names: tuple[Any, ...]) -> type[_SlottedRow]:
        """A new row class for the metric ``names``."""
        slot_names = tuple(f"_{i}" for i in range(len(names)))
        row_class: type[_SlottedRow] = type("SummaryRow", (_SlottedRow,), {"__slots__": slot_names})
        row_class._names = names
        row_class._index = {name: i for i, name in enumerate(names)}
        row_class._slots = tuple(row_class.__dict__[n] for n in slot_names)
        return row_class

    def __getitem__(self, key: str) -> Any:
        try:
            return self._slots[self._index[key]].__get__(self)
        except KeyError:
            raise KeyError(key) from None


class _TupleRow(SummaryRow):
    """A :class:`SummaryRow` that keeps its names beside its values (past the cap on
    row classes)."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: tuple[Any, ...], values: tuple[Any, ...]) -> None:
        self._names = names
        self._values = values

    def __getitem__(self, key: str) -> Any:
        for name, value in zip(self._names, self._values, strict=True):
            if name == key:
                return value
        raise KeyError(key)


def checked_index(index: int, length: int, what: str) -> int:
    """``index`` into a sequence of ``length`` (negative counts from the end) as a
    position; IndexError naming ``what`` when it is outside."""
    position = index + length if index < 0 else index
    if not 0 <= position < length:
        raise IndexError(f"{what} index out of range")
    return position


def snapshots(trials: Sequence[LiveTrial]) -> list[Trial]:
    """Frozen snapshots of ``trials``, in order."""
    return [t.snapshot() for t in trials]


class SnapshotsView(Sequence[Trial]):
    """The first ``len(trials)`` trials (as they are now), snapshotted only when read:
    Ray-style callback hooks get every trial as ``trials`` at each event, which must
    not cost O(trials) per event in a 10,000-trial sweep."""

    __slots__ = ("_length", "_trials")

    def __init__(self, trials: list[LiveTrial]) -> None:
        self._trials = trials
        self._length = len(trials)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Trial: ...

    @overload
    def __getitem__(self, index: slice) -> list[Trial]: ...

    def __getitem__(self, index: int | slice) -> Trial | list[Trial]:
        if isinstance(index, slice):
            return [t.snapshot() for t in self._trials[: self._length][index]]
        return self._trials[checked_index(index, self._length, "trial")].snapshot()
