"""A run's metrics history as chart columns, thinned to what a chart can show.

100,000 reports of three metrics are 3.7 MB of JSON every poll, and a 440-pixel chart
draws at most a few hundred distinct points. :func:`chart_columns` keeps every row of a
short history; a long one is cut into :data:`BUCKETS` buckets of steps, and each keeps
its first step and, for every metric, the step of its lowest and highest value. So a
spike (a NaN loss shows as a gap, a jump as a peak) is never thinned away.
"""

from __future__ import annotations

from typing import Any

BUCKETS = 1000
"""Buckets of steps a long history is thinned to (a few points each)."""


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real, finite number (not a bool), else None."""
    kind = type(value)
    if kind is int or (kind is float and value - value == 0.0):  # inf - inf, nan: not 0
        return float(value)
    return None


def _column(rows: list[dict[str, Any]], name: str) -> list[float | None]:
    out: list[float | None] = []
    add = out.append
    for r in rows:  # _number inlined: this runs once per value of a long history
        v = r.get(name)
        kind = type(v)
        add(float(v) if (kind is float and v - v == 0.0) or kind is int else None)  # type: ignore[arg-type, operator]
    return out


def columns(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """The numeric metrics of ``rows`` as columns (``None`` where a row lacks one)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    found = {name: _column(rows, name) for name in keys}
    return {name: values for name, values in found.items() if any(v is not None for v in values)}


def _picks(series: dict[str, list[float | None]], start: int, end: int) -> set[int]:
    """The steps of ``[start, end)`` that thinning keeps: the first, each metric's min and max."""
    keep = {start}
    for values in series.values():
        low = high = None
        for i in range(start, end):
            v = values[i]
            if v is None:
                continue
            if low is None or v < values[low]:  # type: ignore[operator]
                low = i
            if high is None or v > values[high]:  # type: ignore[operator]
                high = i
        keep.update(i for i in (low, high) if i is not None)
    return keep


def chart_columns(rows: list[dict[str, Any]], buckets: int = BUCKETS) -> dict[str, Any]:
    """``{"steps": n, "x": [step, ...], "series": {metric: [value, ...]}, "thinned": bool}``.

    ``x`` holds the steps kept (all of them for ``n <= 3 * buckets``); each series has
    one value per step of ``x``.
    """
    series = columns(rows)
    n = len(rows)
    if n <= 3 * buckets:
        return {"steps": n, "x": list(range(n)), "series": series, "thinned": False}
    size = -(-n // buckets)
    keep: set[int] = set()
    for start in range(0, n, size):
        keep |= _picks(series, start, min(n, start + size))
    x = sorted(keep | {n - 1})
    thinned = {name: [values[i] for i in x] for name, values in series.items()}
    return {"steps": n, "x": x, "series": thinned, "thinned": True}
