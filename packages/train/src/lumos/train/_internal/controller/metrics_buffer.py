"""MetricsBuffer: rank 0's reports on their way into the run's metrics history.

Reports arrive far faster than storage should be written, so rows are kept in
memory and written in contiguous chunks (``sink(rows, start_index)``): when the
buffer is full, when it is older than ``interval_s``, before a checkpoint commit,
and when a report does not follow the buffered ones (after a restart).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

MetricsSink = Callable[[list[dict[str, Any]], int], None]
"""Writes ``rows`` as the history rows ``start, start + 1, ...`` (``RunStorage.append_metrics``)."""


class MetricsBuffer:
    """Buffers rank 0's report rows and writes them to ``sink`` in contiguous chunks.

    Args:
        sink: Where chunks go; called with ``(rows, start_index)``.
        max_rows: Write as soon as this many rows are buffered.
        interval_s: ``maybe_flush()`` writes rows buffered longer than this.
        clock: Monotonic time source (tests pass a fake one).

    Example:
        >>> written = []
        >>> buf = MetricsBuffer(lambda rows, start: written.append((start, rows)), max_rows=2)
        >>> buf.add(0, {"loss": 1.0}); buf.add(1, {"loss": 0.5})
        >>> written
        [(0, [{'loss': 1.0}, {'loss': 0.5}])]
    """

    def __init__(
        self,
        sink: MetricsSink,
        *,
        max_rows: int = 200,
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink = sink
        self._max_rows = max_rows
        self._interval_s = interval_s
        self._clock = clock
        self._rows: list[dict[str, Any]] = []
        self._start = 0
        self._last_flush = clock()

    @property
    def next_index(self) -> int:
        """The index the next contiguous report would have (rows written plus buffered)."""
        return self._start + len(self._rows)

    def add(self, index: int, metrics: dict[str, Any]) -> None:
        """Buffer report ``index``; writes first when it does not follow the buffered rows."""
        if self._rows and index != self.next_index:
            self.flush()
        if not self._rows:
            self._start = index
        self._rows.append(metrics)
        if len(self._rows) >= self._max_rows:
            self.flush()

    def rewind(self, base: int) -> None:
        """Drop buffered rows from index ``base`` on: a new attempt reports them again."""
        self._rows = [r for i, r in enumerate(self._rows) if self._start + i < base]
        if not self._rows:
            self._start = base

    def maybe_flush(self) -> None:
        """Write the buffered rows if the oldest unwritten ones waited ``interval_s``."""
        if self._rows and self._clock() - self._last_flush >= self._interval_s:
            self.flush()

    def flush(self) -> None:
        """Write every buffered row now."""
        self._last_flush = self._clock()
        if not self._rows:
            return
        rows, start = self._rows, self._start
        self._sink(rows, start)
        self._rows = []
        self._start = start + len(rows)
