"""Read-only, lazy views of trials: a trial's reports and a sweep's snapshots.

Both cost nothing to take in a 10,000-trial sweep: :class:`HistoryView` reads a
compacted trial's reports back from the trial journal on first access, and
:class:`SnapshotsView` snapshots a trial only when it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, overload

from lumos.tune._internal.trial import Trial


class HistoryView(Sequence[dict[str, Any]]):
    """A read-only view of the first ``length`` reports of a trial (copies on access).

    The driver only appends to a trial's history (a retry replaces the list), so a
    prefix of it never changes: the view costs nothing to take. For a finished trial
    whose reports the driver no longer keeps (see ``LiveTrial.compact``), ``rows``
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


class Snapshottable(Protocol):
    """What gives a frozen :class:`Trial` (a ``LiveTrial``)."""

    def snapshot(self) -> Trial:
        """A frozen :class:`Trial` of it as it is now."""
        ...


def checked_index(index: int, length: int, what: str) -> int:
    """``index`` into a sequence of ``length`` (negative counts from the end) as a
    position; IndexError naming ``what`` when it is outside."""
    position = index + length if index < 0 else index
    if not 0 <= position < length:
        raise IndexError(f"{what} index out of range")
    return position


def snapshots(trials: Sequence[Snapshottable]) -> list[Trial]:
    """Frozen snapshots of ``trials``, in order."""
    return [t.snapshot() for t in trials]


class SnapshotsView(Sequence[Trial]):
    """The first ``len(trials)`` trials (as they are now), snapshotted only when read:
    Ray-style callback hooks get every trial as ``trials`` at each event, which must
    not cost O(trials) per event in a 10,000-trial sweep."""

    __slots__ = ("_length", "_trials")

    def __init__(self, trials: Sequence[Snapshottable]) -> None:
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
