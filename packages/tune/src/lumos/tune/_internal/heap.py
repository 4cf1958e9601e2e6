"""Giving the driver's freed heap memory back to the operating system.

glibc's allocator keeps the pages of freed memory for later use, so a long sweep's
driver RSS follows the most it ever held in freed fragments, not what it holds now.
:class:`HeapTrimmer` calls ``malloc_trim(0)`` (about a millisecond) once every
``every`` trial ends; elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # no glibc (musl has no malloc_trim)
        return None
    return trim


class HeapTrimmer:
    """Trims the heap once every ``every`` calls of :meth:`note`.

    Example:
        >>> trimmer = HeapTrimmer(every=256)
        >>> trimmer.note()  # after each trial end
    """

    def __init__(self, every: int = 256, trim: Callable[[int], int] | None = None) -> None:
        if every < 1:
            raise ValueError(f"HeapTrimmer(every={every!r}): give an int >= 1")
        self.every = every
        self._trim = trim if trim is not None else malloc_trim()
        self._count = 0

    def note(self) -> None:
        """Count one event; trim the heap on every ``every``-th."""
        self._count += 1
        if self._trim is not None and self._count % self.every == 0:
            self._trim(0)
