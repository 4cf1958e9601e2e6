"""Owner-side relay for the workers' barrier / broadcast (never surfaces as events)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SendControl = Callable[[list[int], tuple[str, int], Any], None]


class CollectiveRelay:
    """Collects each rank's arrival at a barrier/broadcast and releases all ranks.

    Args:
        world_size: Number of ranks that must arrive.
        send: ``send(ranks, key, value)`` delivers the answer to those ranks.
    """

    def __init__(self, world_size: int, send: SendControl) -> None:
        self.world_size = world_size
        self._send = send
        self._pending: dict[tuple[str, int], dict[int, Any]] = {}
        self._excused: set[int] = set()  # left during this launch: never arrive

    def handle(self, rank: int, key: tuple[str, int], value: Any) -> None:
        self._pending.setdefault(key, {})[rank] = value
        self._release(key)

    def excuse(self, ranks: list[int]) -> None:
        """``ranks``' workers left while the others run (replaced, vacated, moved): no
        barrier or broadcast of this launch waits for them, nor answers them (a rank that
        joins later does not take part in them)."""
        self._excused |= set(ranks)
        for key in list(self._pending):
            self._release(key)

    def _release(self, key: tuple[str, int]) -> None:
        arrived = self._pending[key]
        waiting = [r for r in range(self.world_size) if r not in self._excused]
        if all(r in arrived for r in waiting):
            del self._pending[key]
            answer = arrived.get(0) if key[0] == "bcast" else None
            self._send(waiting, key, answer)

    def reset(self) -> None:
        """A launch on every rank: nothing pending, nobody excused."""
        self._pending.clear()
        self._excused.clear()
