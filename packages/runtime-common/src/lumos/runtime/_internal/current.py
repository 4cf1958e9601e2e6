"""Which session is current: one implementation for the runtime, Train and Tune."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class CurrentSlot(Generic[T]):
    """Holds the session of the job running in this process.

    A thread that activated a session sees it first (the in-process fakes run several
    workers as threads of one process). Any other thread, such as one the user function
    starts, sees the session that is active in the process when there is exactly one;
    with none or several it sees ``None`` rather than guessing.

    Example:
        >>> slot: CurrentSlot[str] = CurrentSlot()
        >>> slot.activate("trial-1")
        >>> slot.get()
        'trial-1'
        >>> slot.deactivate("trial-1")
        >>> slot.get() is None
        True
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._active: list[T] = []

    def get(self) -> T | None:
        """This thread's session, else the process's only active session, else ``None``."""
        own: T | None = getattr(self._local, "session", None)
        if own is not None:
            return own
        with self._lock:
            return self._active[0] if len(self._active) == 1 else None

    def activate(self, session: T) -> None:
        """Make ``session`` current for this thread and active in the process."""
        self._local.session = session
        with self._lock:
            self._active.append(session)

    def deactivate(self, session: T) -> None:
        """Undo ``activate(session)``; a no-op for a session that is not active."""
        if getattr(self._local, "session", None) is session:
            self._local.session = None
        with self._lock:
            self._active = [s for s in self._active if s is not session]
