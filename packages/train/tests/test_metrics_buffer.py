"""MetricsBuffer alone: what is written, when, and from which index (no storage)."""

from __future__ import annotations

from typing import Any

import pytest

from lumos.train._internal.controller.metrics_buffer import MetricsBuffer


class Sink:
    def __init__(self) -> None:
        self.chunks: list[tuple[int, list[Any]]] = []

    def __call__(self, rows: list[dict[str, Any]], start: int) -> None:
        self.chunks.append((start, [r["i"] for r in rows]))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rows_are_written_in_chunks_of_max_rows() -> None:
    sink = Sink()
    buf = MetricsBuffer(sink, max_rows=3, interval_s=1e9, clock=Clock())
    for i in range(7):
        buf.add(i, {"i": i})
    assert sink.chunks == [(0, [0, 1, 2]), (3, [3, 4, 5])]
    assert buf.next_index == 7
    buf.flush()
    assert sink.chunks[-1] == (6, [6])
    buf.flush()  # nothing buffered: nothing written
    assert len(sink.chunks) == 3


def test_maybe_flush_writes_only_after_the_interval() -> None:
    sink, clock = Sink(), Clock()
    buf = MetricsBuffer(sink, max_rows=100, interval_s=2.0, clock=clock)
    buf.add(0, {"i": 0})
    clock.now = 1.9
    buf.maybe_flush()
    assert sink.chunks == []
    clock.now = 2.0
    buf.maybe_flush()
    assert sink.chunks == [(0, [0])]


def test_a_gap_in_the_indices_writes_the_buffered_rows_first() -> None:
    sink = Sink()
    buf = MetricsBuffer(sink, max_rows=100, clock=Clock())
    buf.add(0, {"i": 0})
    buf.add(1, {"i": 1})
    buf.add(5, {"i": 5})
    assert sink.chunks == [(0, [0, 1])]
    buf.flush()
    assert sink.chunks == [(0, [0, 1]), (5, [5])]


def test_rewind_drops_rows_that_the_next_attempt_reports_again() -> None:
    sink = Sink()
    buf = MetricsBuffer(sink, max_rows=100, clock=Clock())
    for i in range(5):
        buf.add(i, {"i": i})
    buf.rewind(3)  # the new attempt resumes after checkpoint #2
    assert buf.next_index == 3
    buf.add(3, {"i": 3})
    buf.flush()
    assert sink.chunks == [(0, [0, 1, 2, 3])]


def test_rewind_of_an_empty_buffer_starts_at_the_resume_point() -> None:
    sink = Sink()
    buf = MetricsBuffer(sink, max_rows=100, clock=Clock())
    buf.rewind(4)
    assert buf.next_index == 4
    buf.add(4, {"i": 4})
    buf.flush()
    assert sink.chunks == [(4, [4])]


def test_a_failing_sink_keeps_the_rows() -> None:
    calls: list[int] = []

    def flaky(rows: list[dict[str, Any]], start: int) -> None:
        calls.append(len(rows))
        if len(calls) == 1:
            raise OSError("storage unreachable")

    buf = MetricsBuffer(flaky, max_rows=100, clock=Clock())
    buf.add(0, {"i": 0})
    with pytest.raises(OSError, match="unreachable"):
        buf.flush()
    buf.add(1, {"i": 1})
    buf.flush()
    assert calls == [1, 2]
