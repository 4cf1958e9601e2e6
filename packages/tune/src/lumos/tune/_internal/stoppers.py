"""Stopper objects (Ray Tune's ``ray.tune.stopper``): ``TuneConfig(stop=...)`` beside the dict.

A stopper is called after every report with ``(trial_id, result)`` and returns
whether that trial should stop; ``stop_all()`` ends the whole sweep (running trials
are stopped, no new ones start). They run in the driver.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.metrics import finite_or_none

ITERATION_KEY = "training_iteration"


class Stopper(ABC):
    """Base class of stoppers: subclass it and implement both methods.

    Example:
        >>> class LossBelow(tune.stopper.Stopper):
        ...     def __call__(self, trial_id, result):
        ...         return result["loss"] < 0.01
        ...     def stop_all(self):
        ...         return False
        >>> tune.TuneConfig(stop=LossBelow())
    """

    @abstractmethod
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Whether trial ``trial_id`` should stop after reporting ``result``."""

    @abstractmethod
    def stop_all(self) -> bool:
        """Whether the whole sweep should stop (checked after every report)."""


class NoopStopper(Stopper):
    """Never stops anything."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class FunctionStopper(Stopper):
    """Wraps a function ``(trial_id, result) -> bool``.

    Example:
        >>> tune.stopper.FunctionStopper(lambda tid, r: r["loss"] < 0.1)
    """

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise TuneConfigError(f"FunctionStopper(function={function!r}): give a callable")
        self._fn = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False


class MaximumIterationStopper(Stopper):
    """Stops each trial after ``max_iter`` reports.

    Example:
        >>> tune.TuneConfig(stop=tune.stopper.MaximumIterationStopper(max_iter=10))
    """

    def __init__(self, max_iter: int) -> None:
        if not isinstance(max_iter, int) or isinstance(max_iter, bool) or max_iter < 1:
            raise TuneConfigError(
                f"MaximumIterationStopper(max_iter={max_iter!r}): give an int >= 1"
            )
        self._max_iter = max_iter

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return int(result.get(ITERATION_KEY, 0)) >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TrialPlateauStopper(Stopper):
    """Stops a trial once ``metric`` has plateaued (Ray's semantics).

    A trial stops when its last ``num_results`` values of ``metric`` have a standard
    deviation at most ``std``, after at least ``grace_period`` reports, and (when
    ``metric_threshold`` is set) the latest value is better than the threshold in
    ``mode``.

    Args:
        metric: The metric to watch.
        std: The standard deviation below which the metric counts as flat.
        num_results: How many recent values are considered.
        grace_period: Reports before the trial may stop.
        metric_threshold: Only stop once the metric is past this value.
        mode: ``"min"`` or ``"max"``, needed with ``metric_threshold``.

    Example:
        >>> tune.TuneConfig(stop=tune.stopper.TrialPlateauStopper("loss", std=0.001))
    """

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: str | None = None,
    ) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise TuneConfigError(
                f"TrialPlateauStopper(metric_threshold={metric_threshold!r}, mode={mode!r}): "
                "a threshold needs mode='min' or mode='max'"
            )
        if not isinstance(num_results, int) or num_results < 1:
            raise TuneConfigError(
                f"TrialPlateauStopper(num_results={num_results!r}): give an int >= 1"
            )
        self._metric = metric
        self._mode = mode
        self._std = std
        self._num_results = num_results
        self._grace_period = grace_period
        self._threshold = metric_threshold
        self._iter: dict[str, int] = defaultdict(int)
        self._results: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=num_results))

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = finite_or_none(result.get(self._metric))
        if value is None:
            return False
        self._results[trial_id].append(value)
        self._iter[trial_id] += 1
        if self._threshold is not None:
            if self._mode == "min" and value > self._threshold:
                return False
            if self._mode == "max" and value < self._threshold:
                return False
        if self._iter[trial_id] < self._grace_period:
            return False
        values = self._results[trial_id]
        if len(values) < self._num_results:
            return False
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return std <= self._std

    def stop_all(self) -> bool:
        return False


class TimeoutStopper(Stopper):
    """Stops the whole sweep ``timeout`` seconds after the stopper was created.

    Args:
        timeout: Seconds, or a ``datetime.timedelta``.

    Example:
        >>> tune.TuneConfig(stop=tune.stopper.TimeoutStopper(3600))
    """

    def __init__(self, timeout: Any) -> None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
            raise TuneConfigError(
                f"TimeoutStopper(timeout={timeout!r}): give seconds > 0 or a timedelta"
            )
        self._timeout_s = float(seconds)
        self._start = time.monotonic()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return time.monotonic() - self._start >= self._timeout_s


class CombinedStopper(Stopper):
    """Stops when any of ``stoppers`` says so.

    Example:
        >>> tune.TuneConfig(stop=tune.stopper.CombinedStopper(
        ...     tune.stopper.MaximumIterationStopper(100),
        ...     tune.stopper.TrialPlateauStopper("loss")))
    """

    def __init__(self, *stoppers: Stopper) -> None:
        for s in stoppers:
            if not isinstance(s, Stopper):
                raise TuneConfigError(
                    f"CombinedStopper({s!r}): every argument must be a tune.stopper.Stopper"
                )
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        # every stopper sees every result (stateful ones count reports)
        return any([s(trial_id, result) for s in self._stoppers])

    def stop_all(self) -> bool:
        return any(s.stop_all() for s in self._stoppers)
