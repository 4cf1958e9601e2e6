"""Small helpers over reported metrics and configs (no I/O, no Optuna)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float when it is a finite real number, else None.

    Example:
        >>> finite_or_none(0.5), finite_or_none(float("nan")), finite_or_none("x")
        (0.5, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        item = getattr(value, "item", None)
        if not callable(item):
            return None
        try:
            value = item()
        except (TypeError, ValueError):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
    f = float(value)
    return f if math.isfinite(f) else None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as one level: keys are paths joined with ``/`` after ``prefix``.

    Example:
        >>> flatten({"lr": 0.1, "model": {"width": 64}}, "config/")
        {'config/lr': 0.1, 'config/model/width': 64}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value
    return out
