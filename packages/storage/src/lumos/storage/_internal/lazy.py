"""Lazy public attributes for a package ``__init__`` (workers import only what they use)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, table: Mapping[str, str], namespace: dict[str, Any], eager: tuple[str, ...] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Module ``__getattr__``, ``__dir__`` and ``__all__`` for a package's public names.

    The table is the one list of the package's lazily loaded names: ``__all__`` is
    derived from it, so the two cannot drift apart.

    Args:
        package: The package's name, for the AttributeError message.
        table: Public name -> module that defines it (imported on first use); a
            submodule of the package maps to its own module name.
        namespace: The package's ``globals()``; a loaded name is cached there.
        eager: Public names the package binds itself (e.g. ``"__version__"``).

    Returns:
        ``(__getattr__, __dir__, __all__)`` for the package module.

    Example:
        >>> __getattr__, __dir__, __all__ = lazy_attributes(  # doctest: +SKIP
        ...     "lumos.storage", {"Checkpoint": "lumos.storage._internal.checkpoint"}, globals(),
        ...     eager=("__version__",))
    """
    names = sorted({*table, *eager})

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = importlib.import_module(module)
        if module != f"{package}.{name}":
            value = getattr(value, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__, names
