"""Ray Tune's top-level helpers by their Ray names: ``TuneContext`` (lumos's
``TrialContext``), ``create_scheduler`` and ``create_searcher`` (by string name)."""

from __future__ import annotations

import inspect
from typing import Any

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.pbt import PopulationBasedTraining
from lumos.tune._internal.ray_compat import (
    _INSTEAD,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    OptunaSearch,
)
from lumos.tune._internal.trial_spec import TrialContext

TuneContext = TrialContext
"""Ray's name of what ``tune.get_context()`` returns (lumos's ``TrialContext``)."""

_SCHEDULERS: dict[str, type[Any]] = {
    "fifo": FIFOScheduler,
    "async_hyperband": AsyncHyperBandScheduler,
    "asynchyperband": AsyncHyperBandScheduler,
    "median_stopping_rule": MedianStoppingRule,
    "medianstopping": MedianStoppingRule,
    "hyperband": HyperBandScheduler,
    "pbt": PopulationBasedTraining,
}
_NO_SCHEDULER = {
    "hb_bohb": "'hyperband' with TuneConfig(sampler=optuna.samplers.TPESampler())",
    "pbt_replay": "'pbt' (lumos replays no PBT policy file)",
    "pb2": "'pbt' (lumos has no PB2)",
    "resource_changing": "tune.with_resources(trainable, lambda config: {...})",
}
_NO_SEARCHER = {
    "variant_generator": "BasicVariantGenerator",
    "random": "BasicVariantGenerator",
    "ax": "AxSearch",
    "hyperopt": "HyperOptSearch",
    "bayesopt": "BayesOptSearch",
    "bohb": "TuneBOHB",
    "nevergrad": "NevergradSearch",
    "zoopt": "ZOOptSearch",
    "hebo": "HEBOSearch",
}


def _known(cls: type[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the ones ``cls`` does not take (Ray drops them the same way)."""
    accepted = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in accepted}


def create_scheduler(scheduler: str, **kwargs: Any) -> Any:
    """A scheduler by Ray's string name: ``"fifo"``, ``"async_hyperband"``,
    ``"median_stopping_rule"``, ``"hyperband"`` or ``"pbt"`` (as Ray, keyword arguments
    the scheduler does not take are dropped).

    Raises:
        TuneConfigError: an unknown name, or one of Ray's schedulers lumos lacks (the
            message names what to use instead).

    Example:
        >>> tune.TuneConfig(scheduler=tune.create_scheduler("async_hyperband", max_t=20))
    """
    name = str(scheduler).lower()
    if name in _NO_SCHEDULER:
        raise TuneConfigError(
            f"create_scheduler({scheduler!r}): lumos has no such scheduler; use "
            f"{_NO_SCHEDULER[name]}"
        )
    cls = _SCHEDULERS.get(name)
    if cls is None:
        raise TuneConfigError(
            f"create_scheduler({scheduler!r}): must be one of {sorted(_SCHEDULERS)}"
        )
    return cls(**_known(cls, kwargs))


def create_searcher(search_alg: str, **kwargs: Any) -> OptunaSearch:
    """A search algorithm by Ray's string name; lumos has ``"optuna"`` (``OptunaSearch``;
    keyword arguments it does not take are dropped, as Ray).

    Raises:
        TuneConfigError: another name (the message names the Optuna sampler to use).

    Example:
        >>> tune.TuneConfig(search_alg=tune.create_searcher("optuna", metric="loss", mode="min"))
    """
    name = str(search_alg).lower()
    if name == "optuna":
        return OptunaSearch(**_known(OptunaSearch, kwargs))
    ray_class = _NO_SEARCHER.get(name)
    if ray_class is None:
        raise TuneConfigError(f"create_searcher({search_alg!r}): must be 'optuna'")
    raise TuneConfigError(
        f"create_searcher({search_alg!r}): lumos searches with Optuna; use "
        f"TuneConfig(sampler={_INSTEAD[ray_class]}) or create_searcher('optuna', sampler=...)"
    )
