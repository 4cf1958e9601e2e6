"""Ray Tune's search spellings (``ray.tune.search``): lumos searches with Optuna.

``ConcurrencyLimiter(searcher, max_concurrent)`` sets ``max_concurrent_trials``;
``lumos.tune.search.optuna.OptunaSearch`` carries an Optuna sampler. Other Ray
searchers are an error naming the Optuna sampler to use instead.

Example:
    >>> from lumos.tune.search import ConcurrencyLimiter
    >>> from lumos.tune.search.optuna import OptunaSearch
    >>> tune.TuneConfig(metric="loss", mode="min",
    ...                 search_alg=ConcurrencyLimiter(OptunaSearch(seed=0), max_concurrent=4))
"""

from __future__ import annotations

from lumos.tune._internal.ray_compat import ConcurrencyLimiter
from lumos.tune._internal.ray_names import create_searcher
from lumos.tune._internal.sample import grid_search

__all__ = ["ConcurrencyLimiter", "create_searcher", "grid_search"]
