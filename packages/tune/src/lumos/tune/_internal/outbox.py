"""Notifications that wait until the journal holds the trial ends they speak of.

Nothing acknowledged is lost: a callback, the console or a ``ResultGrid`` hears of a
trial's end only once the end is written. While an end is buffered (not yet in the
journal), every notification from then on waits here, in order; :meth:`Outbox.acknowledge`
writes the journal (one write for every end of the batch) and then delivers them.
"""

from __future__ import annotations

from collections.abc import Callable


class Outbox:
    """Holds notifications behind buffered trial ends (see the module docstring).

    Args:
        write_journal: Writes every buffered journal record now (a forced flush).
    """

    __slots__ = ("_held", "_unacked", "_write_journal")

    def __init__(self, write_journal: Callable[[], None]) -> None:
        self._write_journal = write_journal
        self._held: list[Callable[[], None]] = []
        self._unacked = False  # a trial end is buffered, not yet in the journal

    def tell(self, notify: Callable[[], None]) -> None:
        """Notify now, or after the buffered trial ends are written (keeping the order)."""
        if self._unacked:
            self._held.append(notify)
        else:
            notify()

    def after_end(self, *notify: Callable[[], None]) -> None:
        """A trial end was just buffered: ``notify`` (and everything after) waits for it."""
        self._unacked = True
        self._held.extend(notify)

    def acknowledge(self) -> None:
        """Write the buffered trial ends (with every record before them), then deliver
        the notifications that waited for them."""
        if self._unacked:
            self._write_journal()
            self.deliver()

    def deliver(self) -> None:
        """Deliver what waits; only once the journal was written (every end it speaks
        of is in it)."""
        self._unacked = False
        while self._held:
            held, self._held = self._held, []
            for notify in held:
                notify()
