"""Training-health checks and rollback to an earlier checkpoint.

``RunConfig(health_checks=[...])``: every check runs in the driver on each of rank
0's reports and on each validation result. A check returns ``None`` (healthy) or a
:class:`Rollback`; the controller then stops the workers and restarts them from the
newest committed checkpoint reported before the bad report (or the checkpoint the
rollback names). The training function learns about it from
``train.get_context().get_rollback_info()``.

Built-in checks: :class:`NonFiniteMetric` and :class:`MetricSpike`. Any callable
``check(report, history) -> Rollback | None`` is a check too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lumos.train._internal.errors import TrainConfigError, TrainTypeError

if TYPE_CHECKING:
    from lumos.storage import Checkpoint


@dataclass(frozen=True)
class HealthReport:
    """What a health check looks at: one report of rank 0, or one validation result.

    Attributes:
        index: The report's index in the run (for a validation: the index of the
            report that carried the validated checkpoint).
        metrics: Rank 0's metrics, or the validation's metrics merged into the
            checkpoint's.
        source: ``"report"`` or ``"validation"``.
        checkpoint: The checkpoint's directory name when the report carried one
            (always, for a validation).
    """

    index: int
    metrics: dict[str, Any]
    source: Literal["report", "validation"] = "report"
    checkpoint: str | None = None


@dataclass(frozen=True)
class Rollback:
    """A health check's verdict: roll training back.

    Args:
        reason: Why, in words (shown on the console and in ``RollbackInfo``).
        to_checkpoint: The checkpoint to resume from: a committed checkpoint's
            directory name or ``train.Checkpoint``. ``None`` (default): the newest
            committed checkpoint reported before the bad report.

    Example:
        >>> Rollback("loss exploded", to_checkpoint="step=100").to_checkpoint
        'step=100'
    """

    reason: str
    to_checkpoint: str | Checkpoint | None = None

    def target_name(self) -> str | None:
        """The named checkpoint's directory name, or ``None``."""
        target = self.to_checkpoint
        if target is None or isinstance(target, str):
            return target
        return str(target.path).rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class RollbackInfo:
    """What ``train.get_context().get_rollback_info()`` returns after a rollback.

    Attributes:
        from_report: Index of the report that made the check fire.
        to_checkpoint: The checkpoint training resumed from (directory name), or
            ``None`` when it restarted from the beginning.
        to_report_index: That checkpoint's report index (``None``: the beginning).
        reason: Why the check fired.
        check: The name of the check that fired.
        number: 1 for the run's first rollback, 2 for the second, ...
        metrics: The metrics that made it fire.

    Example:
        >>> info = train.get_context().get_rollback_info()  # doctest: +SKIP
        >>> if info is not None:  # skip the batches that made the loss spike
        ...     skip = range(info.to_report_index + 1, info.from_report + 1)
    """

    from_report: int
    to_checkpoint: str | None
    to_report_index: int | None
    reason: str
    check: str
    number: int
    metrics: dict[str, Any] = field(default_factory=dict)


HealthCheck = Callable[[HealthReport, Sequence[HealthReport]], "Rollback | None"]
"""``check(report, history) -> Rollback | None``; ``history`` holds the earlier
reports of the same source (oldest first, at most ``HISTORY_LIMIT``) of the current
training trajectory."""

HISTORY_LIMIT = 1000


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _check_metric_name(metric: Any, who: str) -> str:
    if not isinstance(metric, str) or not metric:
        raise TrainTypeError(f"{who}(metric={metric!r}): metric must be a non-empty str")
    return metric


class NonFiniteMetric:
    """Roll back when ``metric`` is NaN or infinite.

    Reports (or validation results) without the metric, or with a non-number, pass.

    Args:
        metric: The metric to watch, e.g. ``"loss"``.

    Example:
        >>> check = NonFiniteMetric("loss")
        >>> check(HealthReport(7, {"loss": float("nan")}), []).reason
        'loss=nan is not finite (report #7)'
    """

    def __init__(self, metric: str) -> None:
        self.metric = _check_metric_name(metric, "NonFiniteMetric")

    def __call__(self, report: HealthReport, history: Sequence[HealthReport]) -> Rollback | None:
        value = _number(report.metrics.get(self.metric))
        if value is None or math.isfinite(value):
            return None
        return Rollback(f"{self.metric}={value} is not finite (report #{report.index})")

    def __repr__(self) -> str:
        return f"NonFiniteMetric({self.metric!r})"


class MetricSpike:
    """Roll back when ``metric`` exceeds ``factor`` times its recent median.

    The median is taken over the last ``window`` finite values of the metric in the
    history; the check waits until the history holds ``window`` of them.

    Args:
        metric: The metric to watch, e.g. ``"loss"``.
        factor: How far above the recent median counts as a spike (> 1).
        window: How many recent values make the median (>= 1).

    Example:
        >>> check = MetricSpike("loss", factor=3.0, window=3)
        >>> past = [HealthReport(i, {"loss": 1.0}) for i in range(3)]
        >>> check(HealthReport(3, {"loss": 5.0}), past).reason
        'loss=5.0 is above 3.0 x its median 1.0 over the last 3 reports (report #3)'
    """

    def __init__(self, metric: str, factor: float = 3.0, window: int = 10) -> None:
        self.metric = _check_metric_name(metric, "MetricSpike")
        if _number(factor) is None or not math.isfinite(factor) or factor <= 1:
            raise TrainConfigError(f"MetricSpike(factor={factor!r}): factor must be a number > 1")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise TrainConfigError(f"MetricSpike(window={window!r}): window must be an int >= 1")
        self.factor = float(factor)
        self.window = window

    def __call__(self, report: HealthReport, history: Sequence[HealthReport]) -> Rollback | None:
        value = _number(report.metrics.get(self.metric))
        if value is None or not math.isfinite(value):
            return None
        recent: list[float] = []
        for past in reversed(history):
            v = _number(past.metrics.get(self.metric))
            if v is not None and math.isfinite(v):
                recent.append(v)
                if len(recent) == self.window:
                    break
        if len(recent) < self.window:
            return None
        median = statistics.median(recent)
        if value <= self.factor * median:
            return None
        return Rollback(
            f"{self.metric}={value} is above {self.factor} x its median {median} over the "
            f"last {self.window} reports (report #{report.index})"
        )

    def __repr__(self) -> str:
        return f"MetricSpike({self.metric!r}, factor={self.factor}, window={self.window})"


def check_name(check: Any) -> str:
    """How the console and ``RollbackInfo.check`` name a check."""
    if isinstance(check, NonFiniteMetric | MetricSpike):
        return repr(check)
    name = getattr(check, "__qualname__", None) or type(check).__qualname__
    return str(name)


def validate_health_checks(value: Any) -> list[HealthCheck]:
    """``RunConfig(health_checks=...)``: a list of callables."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise TrainTypeError(
            f"health_checks={value!r} must be a list of checks, e.g. "
            '[train.NonFiniteMetric("loss"), train.MetricSpike("loss", factor=3)]'
        )
    for i, check in enumerate(value):
        if not callable(check):
            raise TrainTypeError(
                f"health_checks[{i}]={check!r} is not callable; a check is "
                "train.NonFiniteMetric, train.MetricSpike or fn(report, history) -> "
                "train.Rollback | None"
            )
    return list(value)
