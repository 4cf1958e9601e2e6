"""Ray Tune's search-space constructors (``ray.tune.search.sample``), over Optuna.

Each returns a :class:`~lumos.tune._internal.search_space.Domain` the compiled
:class:`~lumos.tune._internal.search_space.SearchSpace` samples through the Optuna
trial, with Ray Tune's names and bound conventions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution

from lumos.tune._internal.errors import SearchSpaceError
from lumos.tune._internal.search_space import (
    Categorical,
    Domain,
    Float,
    GridSearch,
    Integer,
    SampleFrom,
    _finite,
)

_EPS = 1e-9


class Normal(Domain):
    """A float drawn from a normal distribution (``tune.randn``), optionally rounded to ``q``.

    The study stores the quantile ``u`` in ``(0, 1)``; the config gets
    ``mean + sd * Phi^-1(u)``, so any Optuna sampler drives it.
    """

    def __init__(self, fn: str, mean: float, sd: float, q: float | None = None) -> None:
        _finite(fn, mean=mean, sd=sd)
        if sd <= 0:
            raise SearchSpaceError(f"{fn}(sd={sd!r}): sd must be > 0")
        if q is not None:
            _finite(fn, q=q)
            if q <= 0:
                raise SearchSpaceError(f"{fn}(q={q!r}): q must be > 0")
        self.fn = fn
        self.mean = float(mean)
        self.sd = float(sd)
        self.q = None if q is None else float(q)
        self._normal = statistics.NormalDist(self.mean, self.sd)

    def distribution(self) -> BaseDistribution:
        return FloatDistribution(_EPS, 1.0 - _EPS)

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return self.to_config(trial.suggest_float(name, _EPS, 1.0 - _EPS))

    def to_config(self, u: Any) -> float:
        value = self._normal.inv_cdf(min(max(float(u), _EPS), 1.0 - _EPS))
        if self.q is not None:
            value = round(value / self.q) * self.q
        return value

    def __repr__(self) -> str:
        q = f", q={self.q!r}" if self.q is not None else ""
        return f"{self.fn}({self.mean!r}, {self.sd!r}{q})"


class QLogInt(Float):
    """An integer drawn log-uniformly from ``[low, high]`` and rounded to a multiple of ``q``."""

    def __init__(self, low: int, high: int, q: int) -> None:
        for key, value in (("low", low), ("high", high), ("q", q)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise SearchSpaceError(f"qlograndint({key}={value!r}): {key} must be an int")
        if q < 1:
            raise SearchSpaceError(f"qlograndint(q={q!r}): q must be >= 1")
        super().__init__("qlograndint", low, high, log=True, q=q)

    def to_config(self, value: Any) -> Any:
        assert self.q is not None
        quantized = int(round(float(value) / self.q) * self.q)
        lowest = int(math.ceil(self.low / self.q) * self.q)
        highest = int(math.floor(self.high / self.q) * self.q)
        return min(max(quantized, lowest), highest)

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return self.to_config(trial.suggest_float(name, self.low, self.high, log=True))


def uniform(low: float, high: float) -> Domain:
    """A float drawn uniformly from ``[low, high]``.

    Example:
        >>> space = {"dropout": tune.uniform(0.0, 0.5)}
    """
    return Float("uniform", low, high)


def quniform(low: float, high: float, q: float) -> Domain:
    """A float from ``[low, high]`` on the grid ``low, low + q, low + 2q, ...``.

    ``high`` is lowered to the last grid point when ``high - low`` is not a
    multiple of ``q``.
    """
    return Float("quniform", low, high, q=q)


def loguniform(low: float, high: float) -> Domain:
    """A float drawn log-uniformly from ``[low, high]`` (``0 < low <= high``).

    Example:
        >>> space = {"lr": tune.loguniform(1e-4, 1e-1)}
    """
    return Float("loguniform", low, high, log=True)


def qloguniform(low: float, high: float, q: float) -> Domain:
    """A float drawn log-uniformly from ``[low, high]`` and rounded to a multiple of ``q``."""
    return Float("qloguniform", low, high, log=True, q=q)


def _exclusive_range(fn: str, low: int, high: int) -> None:
    for key, value in (("low", low), ("high", high)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SearchSpaceError(f"{fn}({key}={value!r}): {key} must be an int")
    if low >= high:
        raise SearchSpaceError(
            f"{fn}(low={low!r}, high={high!r}): high is exclusive, so low must be < high"
        )


def randint(low: int, high: int) -> Domain:
    """An integer in ``[low, high)`` (``high`` is exclusive, as in Ray Tune).

    Example:
        >>> space = {"layers": tune.randint(1, 5)}   # 1, 2, 3 or 4
    """
    _exclusive_range("randint", low, high)
    return Integer("randint", low, high - 1)


def qrandint(low: int, high: int, q: int = 1) -> Domain:
    """An integer in ``[low, high]`` (inclusive, as in Ray Tune) on the grid ``low + k*q``."""
    return Integer("qrandint", low, high, q=q)


def lograndint(low: int, high: int) -> Domain:
    """An integer in ``[low, high)`` drawn on a log scale (``1 <= low``; ``high`` exclusive)."""
    _exclusive_range("lograndint", low, high)
    return Integer("lograndint", low, high - 1, log=True)


def choice(categories: Sequence[Any]) -> Domain:
    """One of ``categories`` (any objects; non-primitive ones are stored by index).

    Example:
        >>> space = {"act": tune.choice(["relu", "gelu"])}
    """
    return Categorical(categories)


def grid_search(values: Sequence[Any]) -> GridSearch:
    """Try every value; several grid searches try every combination.

    With ``num_samples=n`` the whole grid is repeated ``n`` times (as in Ray Tune);
    the other parameters are still drawn by the sampler.

    Example:
        >>> space = {"batch": tune.grid_search([32, 64]), "lr": tune.loguniform(1e-4, 1e-1)}
    """
    return GridSearch(values)


def randn(mean: float = 0.0, sd: float = 1.0) -> Domain:
    """A float drawn from a normal distribution ``N(mean, sd)``.

    Example:
        >>> space = {"init_scale": tune.randn(0.0, 0.02)}
    """
    return Normal("randn", mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Domain:
    """A float drawn from ``N(mean, sd)`` and rounded to a multiple of ``q``.

    Example:
        >>> space = {"offset": tune.qrandn(0.0, 1.0, 0.1)}
    """
    return Normal("qrandn", mean, sd, q=q)


def qlograndint(low: int, high: int, q: int) -> Domain:
    """An integer drawn log-uniformly from ``[low, high]`` (inclusive, as in Ray Tune),
    rounded to a multiple of ``q``.

    Example:
        >>> space = {"batch": tune.qlograndint(16, 1024, 16)}
    """
    return QLogInt(low, high, q)


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """A value computed by ``func(spec)`` from the rest of the trial's config.

    ``spec.config`` holds the sampled parameters (``spec.config.lr`` or
    ``spec.config["lr"]``). The value is not a parameter of the Optuna study (a
    sampler does not learn it); for conditional spaces use a define-by-run
    ``param_space`` instead.

    Example:
        >>> space = {"lr": tune.loguniform(1e-4, 1e-1),
        ...          "warmup_lr": tune.sample_from(lambda spec: spec.config.lr / 10)}
    """
    return SampleFrom(func)
