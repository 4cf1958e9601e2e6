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

    def handle(self, rank: int, key: tuple[str, int], value: Any) -> None:
        arrived = self._pending.setdefault(key, {})
        arrived[rank] = value
        if len(arrived) >= self.world_size:
            del self._pending[key]
            answer = arrived.get(0) if key[0] == "bcast" else None
            self._send(list(range(self.world_size)), key, answer)

    def reset(self) -> None:
        self._pending.clear()
