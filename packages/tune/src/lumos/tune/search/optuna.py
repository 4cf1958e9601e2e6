"""``OptunaSearch`` under Ray's module path (``ray.tune.search.optuna``)."""

from __future__ import annotations

from lumos.tune._internal.ray_compat import OptunaSearch

__all__ = ["OptunaSearch"]
