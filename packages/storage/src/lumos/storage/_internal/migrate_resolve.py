"""How ``lumos migrate`` looks up a dotted Ray name in its table (pure: strings in, a
decision out; the table is :mod:`lumos.storage._internal.migrate_table`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from lumos.storage._internal.migrate_table import (
    AMBIGUOUS,
    MISSING,
    MODULE_NOTES,
    MODULES,
    NAMES,
    OURS,
    RAY_ALIASES,
)


@dataclass(frozen=True)
class Mapped:
    """A Ray name or module that lumos has.

    Attributes:
        target: The lumos name (``lumos.tune.Tuner``) or module (``lumos.tune``).
        is_module: ``target`` is a module.
        note: A remark to print with the rewrite (which of two lumos names an
            ambiguous ``ray.air`` name became), or None.
    """

    target: str
    is_module: bool = False
    note: str | None = None

    @property
    def module(self) -> str:
        """The lumos module to import for :attr:`target`."""
        return self.target if self.is_module else self.target.rpartition(".")[0]


@dataclass(frozen=True)
class Missing:
    """A Ray name or module with no lumos equivalent.

    Attributes:
        reason: Why, and the way out.
    """

    reason: str


Resolution = Mapped | Missing
"""What a Ray name becomes: :class:`Mapped` or :class:`Missing`."""


def is_ours(name: str) -> bool:
    """Whether ``name`` is in Ray Train, Ray Tune or Ray AIR (what ``lumos migrate`` rewrites)."""
    return any(name == p or name.startswith(p + ".") for p in OURS)


def _canonical(module: str) -> str:
    """The public Ray module that holds a deeper module's names (itself if none)."""
    while module in RAY_ALIASES:
        module = RAY_ALIASES[module]
    return module


def _ambiguous(name: str, uses_tune: bool) -> Mapped:
    train, tune = AMBIGUOUS[name]
    chosen, other = (tune, train) if uses_tune else (train, tune)
    why = "uses" if uses_tune else "does not use"
    note = (
        f"{name} is both Ray Train's and Ray Tune's: chose {chosen} (this file {why} "
        f"Ray Tune); the other one is {other}"
    )
    return Mapped(chosen, note=note)


def lookup(name: str, uses_tune: bool) -> Resolution | None:
    """The table's entry for exactly ``name``, None when the table does not know it.

    Args:
        name: A dotted Ray name or module (``ray.tune.Tuner``).
        uses_tune: The file uses Ray Tune (picks the lumos.tune side of a ``ray.air`` name).
    """
    if name in MODULES:
        return Mapped(MODULES[name], is_module=True)
    if name in RAY_ALIASES:
        return lookup(_canonical(name), uses_tune)
    if name in NAMES:
        return Mapped(NAMES[name])
    if name in AMBIGUOUS:
        return _ambiguous(name, uses_tune)
    if name in MISSING:
        return Missing(MISSING[name])
    parent, _, last = name.rpartition(".")
    if parent in RAY_ALIASES:
        return lookup(f"{_canonical(parent)}.{last}", uses_tune)
    return None


def resolve(name: str, uses_tune: bool) -> tuple[Resolution, str] | None:
    """What a dotted Ray name becomes, through its longest known prefix.

    Args:
        name: A dotted name as the code spells it in full
            (``ray.tune.schedulers.ASHAScheduler.some_attribute``).
        uses_tune: As for :func:`lookup`.

    Returns:
        ``(resolution, rest)``: ``rest`` is what follows the known prefix
        (``".some_attribute"``, or ``""``), to keep after the lumos name. None when
        ``name`` is not a Ray Train / Tune / AIR name.
    """
    if not is_ours(name):
        return None
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        prefix = ".".join(parts[:end])
        found = lookup(prefix, uses_tune)
        if found is None:
            continue
        if isinstance(found, Mapped) and found.is_module and end < len(parts):
            note = MODULE_NOTES.get(_canonical(prefix))
            unknown = f"{found.target} has no {parts[end]!r}"
            return Missing(f"{unknown}: {note}" if note else f"{unknown}; port it by hand"), ""
        rest = "".join(f".{p}" for p in parts[end:])
        return found, rest
    return Missing("lumos migrate does not know it; port it by hand"), ""


def lumos_targets() -> list[Mapped]:
    """Every lumos module and name the table rewrites to, each once, sorted (what
    lumos-tune's tests import, name by name)."""
    found = {t: Mapped(t, is_module=True) for t in MODULES.values()}
    for target in [*NAMES.values(), *(t for pair in AMBIGUOUS.values() for t in pair)]:
        found.setdefault(target, Mapped(target))
    return [found[t] for t in sorted(found)]


def missing_targets(package: str) -> list[str]:
    """The table's targets under ``lumos.<package>`` that the installed lumos lacks,
    each as ``"name (error)"``; empty when every rewrite lands on a real name.

    Example:
        >>> missing_targets("tune")  # doctest: +SKIP
        []
    """
    missing: list[str] = []
    for target in lumos_targets():
        if target.target.split(".")[:2] != ["lumos", package]:
            continue
        try:
            module = importlib.import_module(target.module)
            if not target.is_module:
                getattr(module, target.target.rpartition(".")[2])
        except (ImportError, AttributeError) as exc:
            missing.append(f"{target.target} ({type(exc).__name__}: {exc})")
    return missing
