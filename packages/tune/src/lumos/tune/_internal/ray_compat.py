"""Ray Tune's spellings on top of Optuna: schedulers that map onto Optuna pruners, and
``OptunaSearch`` / ``ConcurrencyLimiter`` that map onto a sampler and a concurrency.

``TuneConfig`` normalises them (:func:`normalise_tune_config`) before validating, so
the rest of lumos only ever sees an Optuna sampler, pruner, stop criteria and
``max_concurrent_trials``. Each mapping is documented side by side in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import optuna

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.stoppers import CombinedStopper, FunctionStopper, Stopper

ITERATION_KEY = "training_iteration"


class PrunerScheduler:
    """Base of Ray's early-stopping schedulers, each mapped onto an Optuna pruner.

    Optuna pruners count reports, so ``time_attr`` must be ``"training_iteration"``.
    """

    def __init__(
        self, time_attr: str, metric: str | None, mode: str | None, max_t: float | None
    ) -> None:
        name = type(self).__name__
        if time_attr != ITERATION_KEY:
            raise TuneConfigError(
                f"{name}(time_attr={time_attr!r}): lumos maps {name} onto an Optuna pruner, "
                "which counts reports; use time_attr='training_iteration'"
            )
        if mode is not None and mode not in ("min", "max"):
            raise TuneConfigError(f"{name}(mode={mode!r}): use 'min' or 'max'")
        self.time_attr = time_attr
        self.metric = metric
        self.mode = mode
        self.max_t = max_t

    def to_pruner(self) -> optuna.pruners.BasePruner:
        """The Optuna pruner that does what this scheduler does."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(-> {type(self.to_pruner()).__name__})"


class FIFOScheduler(PrunerScheduler):
    """Ray's ``FIFOScheduler``: no early stopping (Optuna's ``NopPruner``)."""

    def __init__(self) -> None:
        super().__init__(ITERATION_KEY, None, None, None)

    def to_pruner(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()


class AsyncHyperBandScheduler(PrunerScheduler):
    """Ray's ASHA as Optuna's ``SuccessiveHalvingPruner``.

    ``grace_period`` -> ``min_resource``, ``reduction_factor`` -> ``reduction_factor``;
    trials stop at ``max_t`` reports, as in Ray.

    Example:
        >>> from lumos.tune.schedulers import ASHAScheduler
        >>> tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(max_t=20))
    """

    def __init__(
        self,
        time_attr: str = ITERATION_KEY,
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 100,
        grace_period: int = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__(time_attr, metric, mode, max_t)
        if grace_period < 1 or max_t < grace_period:
            raise TuneConfigError(
                f"ASHAScheduler(grace_period={grace_period!r}, max_t={max_t!r}): need "
                "1 <= grace_period <= max_t"
            )
        if reduction_factor <= 1:
            raise TuneConfigError(f"ASHAScheduler(reduction_factor={reduction_factor!r}): > 1")
        if brackets != 1:
            raise TuneConfigError(
                f"ASHAScheduler(brackets={brackets!r}): lumos supports one bracket; for "
                "several use HyperBandScheduler (Optuna's HyperbandPruner)"
            )
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor

    def to_pruner(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=self.grace_period, reduction_factor=int(self.reduction_factor)
        )


ASHAScheduler = AsyncHyperBandScheduler


class HyperBandScheduler(PrunerScheduler):
    """Ray's ``HyperBandScheduler`` as Optuna's ``HyperbandPruner(1, max_t, reduction_factor)``."""

    def __init__(
        self,
        time_attr: str = ITERATION_KEY,
        metric: str | None = None,
        mode: str | None = None,
        max_t: int = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__(time_attr, metric, mode, max_t)
        if max_t < 1 or reduction_factor <= 1:
            raise TuneConfigError(
                f"HyperBandScheduler(max_t={max_t!r}, reduction_factor={reduction_factor!r}): "
                "need max_t >= 1 and reduction_factor > 1"
            )
        self.reduction_factor = reduction_factor

    def to_pruner(self) -> optuna.pruners.BasePruner:
        assert self.max_t is not None
        return optuna.pruners.HyperbandPruner(
            min_resource=1,
            max_resource=int(self.max_t),
            reduction_factor=int(self.reduction_factor),
        )


class MedianStoppingRule(PrunerScheduler):
    """Ray's ``MedianStoppingRule`` as Optuna's ``MedianPruner``.

    ``grace_period`` (reports here, not seconds) -> ``n_warmup_steps``,
    ``min_samples_required`` -> ``n_startup_trials``.
    """

    def __init__(
        self,
        time_attr: str = ITERATION_KEY,
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 1,
        min_samples_required: int = 3,
        min_time_slice: int = 0,
        hard_stop: bool = True,
    ) -> None:
        super().__init__(time_attr, metric, mode, None)
        self.grace_period = grace_period
        self.min_samples_required = min_samples_required

    def to_pruner(self) -> optuna.pruners.BasePruner:
        return optuna.pruners.MedianPruner(
            n_startup_trials=self.min_samples_required, n_warmup_steps=int(self.grace_period)
        )


class OptunaSearch:
    """Ray's ``OptunaSearch``: lumos searches with Optuna already, so this only carries
    the sampler (default ``TPESampler(seed=seed)``), an optional space and points.

    Args:
        space: A dict of Optuna distributions or a define-by-run function; used when
            the Tuner has no ``param_space``.
        metric, mode: As ``TuneConfig``'s (filled in when it has none).
        points_to_evaluate: Configs to try first.
        sampler: Any Optuna sampler.
        seed: Seed of the default ``TPESampler``.

    Example:
        >>> from lumos.tune.search.optuna import OptunaSearch
        >>> tune.TuneConfig(metric="loss", mode="min",
        ...                 search_alg=OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0)))
    """

    def __init__(
        self,
        space: Mapping[str, Any] | Callable[..., Any] | None = None,
        metric: str | list[str] | None = None,
        mode: str | list[str] | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        sampler: optuna.samplers.BaseSampler | None = None,
        seed: int | None = None,
        evaluated_rewards: list[Any] | None = None,
    ) -> None:
        if evaluated_rewards:
            raise TuneConfigError(
                "OptunaSearch(evaluated_rewards=...) is not supported: add the trials to "
                "the experiment's study (tune.load_study(...)) instead"
            )
        if sampler is not None and seed is not None:
            raise TuneConfigError("OptunaSearch: give sampler or seed, not both")
        self.space = space
        self.metric = metric
        self.mode = mode
        self.points_to_evaluate = points_to_evaluate
        self.sampler = sampler or optuna.samplers.TPESampler(seed=seed)


class ConcurrencyLimiter:
    """Ray's ``ConcurrencyLimiter(searcher, max_concurrent)``: ``max_concurrent_trials``."""

    def __init__(self, searcher: Any, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise TuneConfigError(
                f"ConcurrencyLimiter(max_concurrent={max_concurrent!r}): give an int >= 1"
            )
        self.searcher = searcher
        self.max_concurrent = max_concurrent


# Ray searchers lumos cannot run, and the Optuna sampler that does the same job.
_INSTEAD = {
    "HyperOptSearch": "optuna.samplers.TPESampler (HyperOpt's algorithm)",
    "BayesOptSearch": "optuna.samplers.GPSampler",
    "AxSearch": "optuna.samplers.GPSampler",
    "HEBOSearch": "optuna.samplers.GPSampler",
    "TuneBOHB": "optuna.samplers.TPESampler with pruner=optuna.pruners.HyperbandPruner()",
    "NevergradSearch": "optuna.samplers.CmaEsSampler",
    "ZOOptSearch": "optuna.samplers.CmaEsSampler",
    "BasicVariantGenerator": "optuna.samplers.RandomSampler (or GridSampler)",
}


def normalise_tune_config(data: dict[str, Any]) -> dict[str, Any]:
    """``TuneConfig`` fields with Ray's ``search_alg`` / pruner-like ``scheduler``
    turned into ``sampler``, ``pruner``, ``stop``, ``max_concurrent_trials``."""
    data = dict(data)
    search = data.get("search_alg")
    if search is not None:
        if isinstance(search, ConcurrencyLimiter):
            _fill(data, "max_concurrent_trials", search.max_concurrent, "ConcurrencyLimiter")
            search = search.searcher
        if not isinstance(search, OptunaSearch):
            name = type(search).__name__
            instead = _INSTEAD.get(name, "an Optuna sampler")
            raise TuneConfigError(
                f"search_alg={name}: lumos searches with Optuna; pass "
                f"TuneConfig(sampler={instead}) instead"
            )
        _fill(data, "sampler", search.sampler, "search_alg")
        _fill(data, "points_to_evaluate", search.points_to_evaluate, "search_alg")
        _fill_metric(data, search.metric, search.mode, "OptunaSearch")
    scheduler = data.get("scheduler")
    if isinstance(scheduler, PrunerScheduler):
        data["scheduler"] = None
        _fill(data, "pruner", scheduler.to_pruner(), type(scheduler).__name__)
        _fill_metric(data, scheduler.metric, scheduler.mode, type(scheduler).__name__)
        if scheduler.max_t is not None:
            data["stop"] = _with_max_t(data.get("stop"), scheduler.time_attr, scheduler.max_t)
    return data


def _fill(data: dict[str, Any], key: str, value: Any, source: str) -> None:
    if value is None:
        return
    if data.get(key) is not None and data[key] is not value:
        raise TuneConfigError(f"TuneConfig({key}=...) and {source} both set {key}; give it once")
    data[key] = value


def _fill_metric(data: dict[str, Any], metric: Any, mode: Any, source: str) -> None:
    for key, value in (("metric", metric), ("mode", mode)):
        if value is None:
            continue
        if data.get(key) is not None and data[key] != value:
            raise TuneConfigError(
                f"TuneConfig({key}={data[key]!r}) and {source}({key}={value!r}) disagree"
            )
        data[key] = value


def _with_max_t(stop: Any, time_attr: str, max_t: float) -> Any:
    return combine_stops(stop, {time_attr: max_t})


def combine_stops(first: Any, second: Any) -> Any:
    """Stop criteria that stop a trial when either ``first`` or ``second`` does."""
    if first is None or second is None:
        return second if first is None else first
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        merged = dict(first)
        for key, bound in second.items():
            merged[key] = min(bound, merged[key]) if key in merged else bound
        return merged
    return CombinedStopper(_as_stopper(first), _as_stopper(second))


def _as_stopper(stop: Any) -> Stopper:
    if isinstance(stop, Stopper):
        return stop
    if isinstance(stop, Mapping):
        bounds = dict(stop)
        return FunctionStopper(
            lambda _tid, result: any(
                isinstance(result.get(k), (int, float)) and result[k] >= v
                for k, v in bounds.items()
            )
        )
    return FunctionStopper(stop)
