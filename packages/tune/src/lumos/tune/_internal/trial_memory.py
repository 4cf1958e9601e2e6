"""How a finished trial stays small: the driver keeps every trial of a sweep, 10,000 or more.

:class:`RareField` is a :class:`~lumos.tune._internal.live_trial.LiveTrial` field that
most finished trials hold at its default, kept in the trial's one ``_more`` dict
(None while all such fields hold defaults) instead of a slot of its own;
:class:`SummaryRow` is a finished trial's last metrics, sharing one class per set of
metric names; :func:`same_dicts` says when one params dict can stand for another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload

_T = TypeVar("_T")


class HoldsRareFields(Protocol):
    """An object whose :class:`RareField` values live in its ``_more`` dict."""

    _more: dict[str, Any] | None


class RareField(Generic[_T]):
    """A field that most finished trials hold at its default: kept in the owner's
    ``_more`` dict (None once it holds only defaults), not in a slot of its own. A
    10,000-trial sweep keeps 10,000 trials; each slot is 8 bytes of every one.

    ``default_of`` computes a default from the owner (a path from its name).
    """

    __slots__ = ("default", "default_of", "name")

    def __init__(self, default: _T, default_of: Callable[[Any], _T] | None = None) -> None:
        self.default = default
        self.default_of = default_of
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, owner_obj: None, owner: type | None = None) -> RareField[_T]: ...

    @overload
    def __get__(self, owner_obj: HoldsRareFields, owner: type | None = None) -> _T: ...

    def __get__(
        self, owner_obj: HoldsRareFields | None, owner: type | None = None
    ) -> _T | RareField[_T]:
        if owner_obj is None:
            return self
        more = owner_obj._more
        if more is not None:
            try:
                return more[self.name]  # type: ignore[no-any-return]
            except KeyError:
                pass
        return self.default_for(owner_obj)

    def __set__(self, owner_obj: HoldsRareFields, value: _T) -> None:
        if owner_obj._more is None:
            owner_obj._more = {self.name: value}
        else:
            owner_obj._more[self.name] = value

    def __delete__(self, owner_obj: HoldsRareFields) -> None:
        if owner_obj._more is not None:
            owner_obj._more.pop(self.name, None)

    def default_for(self, owner_obj: HoldsRareFields) -> _T:
        """The field's default for ``owner_obj``."""
        return self.default if self.default_of is None else self.default_of(owner_obj)

    def is_default(self, owner_obj: HoldsRareFields, value: Any) -> bool:
        """Whether ``value`` is the field's default for ``owner_obj`` (same type, equal)."""
        default = self.default_for(owner_obj)
        return value is default or (type(value) is type(default) and value == default)


def rare_fields(cls: type) -> dict[str, RareField[Any]]:
    """The :class:`RareField` descriptors of ``cls``, by name."""
    return {name: field_ for name, field_ in vars(cls).items() if isinstance(field_, RareField)}


def forget_defaults(owner_obj: HoldsRareFields, fields: Mapping[str, RareField[Any]]) -> None:
    """Drop the rare fields of ``owner_obj`` that hold their default (``_more`` None if
    all do)."""
    more = owner_obj._more
    if more is None:
        return
    for name, value in list(more.items()):
        if fields[name].is_default(owner_obj, value):
            del more[name]
    if not more:
        owner_obj._more = None


def same_dicts(first: dict[str, Any], *others: dict[str, Any]) -> bool:
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
