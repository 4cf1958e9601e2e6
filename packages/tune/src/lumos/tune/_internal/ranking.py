"""How trials rank: a trial's value of a metric under a ``get_best_result`` scope, and
the Pareto front of several metrics (``ResultGrid.get_best_result`` / ``get_pareto_front``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.metrics import finite_or_none


def scope_window(scope: str) -> int | None:
    """N of ``"last-N-avg"``, 0 for ``"avg"``, None for ``"last"`` / ``"all"``."""
    if scope in ("last", "all"):
        return None
    if scope == "avg":
        return 0
    parts = scope.split("-")
    n = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
    if parts[0] == "last" and parts[-1] == "avg" and n > 0:
        return n
    raise TuneConfigError(
        f"get_best_result(scope={scope!r}): use 'last', 'all', 'avg', 'last-5-avg' or "
        "'last-10-avg' (any 'last-N-avg')"
    )


def _number(value: Any, filter_nan_and_inf: bool) -> float | None:
    if filter_nan_and_inf:
        return finite_or_none(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if math.isnan(value) else float(value)
    return None


def scoped_value(
    metrics: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    metric: str,
    mode: str,
    scope: str,
    last_n: int | None,
    filter_nan_and_inf: bool,
) -> float | None:
    """The value of ``metric`` for a trial with last ``metrics`` and reports ``history``
    under ``scope`` (None when it has none); ``last_n`` is ``scope_window(scope)``."""
    if scope == "last":
        return _number(metrics.get(metric), filter_nan_and_inf)
    values = [
        v for row in history if (v := _number(row.get(metric), filter_nan_and_inf)) is not None
    ]
    if not values:
        return None
    if scope == "all":
        return min(values) if mode == "min" else max(values)
    window = values[-last_n:] if last_n else values
    mean = sum(window) / len(window)
    return None if math.isnan(mean) else mean


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=False)) and any(
        x < y for x, y in zip(a, b, strict=False)
    )


def signed_values(
    metrics: Mapping[str, Any], names: Sequence[Any], modes: Sequence[Any]
) -> list[float] | None:
    """The finite values of ``names`` in ``metrics``, negated where the mode is ``"max"``
    (so smaller is better for all); None when one is missing or not finite."""
    values = [finite_or_none(metrics.get(str(m))) for m in names]
    if any(v is None for v in values):
        return None
    return [
        float(v) if mode == "min" else -float(v)  # type: ignore[arg-type]
        for v, mode in zip(values, modes, strict=False)
    ]


def pareto_front(points: Sequence[tuple[list[float], int]]) -> list[int]:
    """The keys of the ``(signed values, key)`` points no other point dominates."""
    return [i for p, i in points if not any(_dominates(q, p) for q, _ in points if q is not p)]
