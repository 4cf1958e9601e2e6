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
from typing import TYPE_CHECKING, Any, ClassVar, overload

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


@dataclass(eq=False, slots=True)
class LiveTrial:
    """The driver's mutable record of one trial (see :class:`Trial` for the fields).

    Only the controller (and the restore of an experiment) changes it. Slotted: a
    sweep of 10,000 trials keeps 10,000 of them.
    """

    number: int
    config: dict[str, Any]
    params: dict[str, Any]
    path: str
    trial_id: str = ""
    trial_name: str = ""
    status: TrialStatus = TrialStatus.PENDING
    last_result: Mapping[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] | tuple[()] = field(default_factory=list, repr=False)
    checkpoint_dir: str | None = None
    checkpoint_iteration: int = 0
    iteration: int = 0
    attempt: int = 0
    errors: Sequence[TrialErrorRecord] = ()
    stop_reason: str | None = None
    waiting_for_resources: bool = False
    optuna_trial: optuna.Trial | None = field(default=None, repr=False)
    max_step_reported: int = -1
    seen_metrics: AbstractSet[str] = field(default_factory=frozenset, repr=False)
    start_time: float = 0.0
    end_time: float = 0.0
    exploits: Sequence[ExploitRecord] = ()
    dir_name: str = ""
    trainable_name: str = ""
    stored_history: Callable[[int], list[dict[str, Any]]] | None = field(default=None, repr=False)
    stored_length: int = 0
    path_prefix: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.trial_id:
            self.trial_id = trial_id(self.number)
        default = trial_name(self.number)  # one string for both names
        if not self.trial_name:
            self.trial_name = default
        if not self.dir_name:
            self.dir_name = default

    if not TYPE_CHECKING:  # (hidden from type checkers: it would accept any name)

        def __getattr__(self, name: str) -> str:
            # Only reached for a name slot that compact() left unset because it held
            # the default, rebuilt here (a 10,000-trial sweep keeps no copy of it).
            if name == "trial_id":
                return trial_id(self.number)
            if name in ("trial_name", "dir_name"):
                return trial_name(self.number)
            if name == "path":
                return f"{self.path_prefix}/{self.dir_name}"
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
        self.seen_metrics = _NO_METRICS
        self.optuna_trial = None
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

    def _forget_default_names(self) -> None:
        default = trial_name(self.number)
        if self.dir_name == default:
            prefix, _, tail = self.path.rpartition("/")
            if tail == default and prefix:
                self.path_prefix = sys.intern(prefix)  # one string for all trials
                del self.path
            del self.dir_name
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


_NO_METRICS: frozenset[str] = frozenset()


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
    """A finished trial's last metrics, read-only: a tuple of values under a tuple of
    names that every row with the same names shares (about half a dict's memory; a
    10,000-trial sweep keeps one per trial).

    Example:
        >>> row = SummaryRow.of({"loss": 0.5, "training_iteration": 3})
        >>> row["loss"], dict(row)
        (0.5, {'loss': 0.5, 'training_iteration': 3})
    """

    __slots__ = ("_names", "_values")

    _shared_names: ClassVar[dict[tuple[Any, ...], tuple[Any, ...]]] = {}

    def __init__(self, names: tuple[Any, ...], values: tuple[Any, ...]) -> None:
        self._names = names
        self._values = values

    @classmethod
    def of(cls, metrics: Mapping[str, Any]) -> SummaryRow:
        """The row of ``metrics`` (its names shared with every row that has the same)."""
        if isinstance(metrics, SummaryRow):
            return metrics
        names = tuple(metrics)
        shared = cls._shared_names.setdefault(names, names)
        return cls(shared, tuple(metrics.values()))

    def __getitem__(self, key: str) -> Any:
        for name, value in zip(self._names, self._values, strict=True):
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (SummaryRow.of, (dict(self),))


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
