"""HealthMonitor: runs the run's health checks on rank 0's reports and on validations.

Pure (no I/O): it keeps a bounded history per source (reports, validations) of the
current training trajectory and returns a :class:`Fired` when a check asks for a
rollback. After a rollback or a restart, :meth:`HealthMonitor.rewind` forgets the
reports that will be made again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lumos.train._internal.health import (
    HISTORY_LIMIT,
    HealthCheck,
    HealthReport,
    Rollback,
    check_name,
)


@dataclass(frozen=True)
class Fired:
    """A health check asked for a rollback.

    Attributes:
        check: The check's name.
        rollback: What it returned.
        report: The report (or validation result) it fired on.
    """

    check: str
    rollback: Rollback
    report: HealthReport


class HealthCheckError(Exception):
    """A health check raised or returned something other than ``Rollback | None``."""


class HealthMonitor:
    """Runs ``checks`` in order; the first that fires wins.

    Args:
        checks: The run's health checks.
        history: Earlier rank-0 metrics of the run, by report index (a resumed run
            seeds the report history from its stored metrics).

    Example:
        >>> from lumos.train._internal.health import NonFiniteMetric
        >>> monitor = HealthMonitor([NonFiniteMetric("loss")])
        >>> monitor.on_report(0, {"loss": 1.0}) is None
        True
        >>> monitor.on_report(1, {"loss": float("inf")}).check
        "NonFiniteMetric('loss')"
    """

    def __init__(
        self, checks: Sequence[HealthCheck], history: Iterable[dict[str, Any]] = ()
    ) -> None:
        self.checks = list(checks)
        self._names = [check_name(c) for c in self.checks]
        self._history: dict[str, deque[HealthReport]] = {
            "report": deque(maxlen=HISTORY_LIMIT),
            "validation": deque(maxlen=HISTORY_LIMIT),
        }
        for index, metrics in enumerate(history):
            self._history["report"].append(HealthReport(index, dict(metrics)))

    def on_report(
        self, index: int, metrics: dict[str, Any], checkpoint: str | None = None
    ) -> Fired | None:
        """Check rank 0's report ``index``; it joins the history when healthy."""
        return self._check(HealthReport(index, metrics, "report", checkpoint))

    def on_validation(self, index: int, metrics: dict[str, Any], dir_name: str) -> Fired | None:
        """Check a validation's result (``metrics``: the checkpoint's merged metrics)."""
        return self._check(HealthReport(index, metrics, "validation", dir_name))

    def rewind(self, base: int) -> None:
        """Forget the reports from index ``base`` on (they will be made again)."""
        for history in self._history.values():
            while history and history[-1].index >= base:
                history.pop()

    def _check(self, report: HealthReport) -> Fired | None:
        source: Literal["report", "validation"] = report.source
        history = self._history[source]
        past = tuple(history)
        for check, name in zip(self.checks, self._names, strict=True):
            try:
                verdict = check(report, past)
            except Exception as exc:
                raise HealthCheckError(
                    f"health check {name} raised {type(exc).__name__}: {exc} on {source} "
                    f"#{report.index}; a check must return None or train.Rollback"
                ) from exc
            if verdict is None:
                continue
            if not isinstance(verdict, Rollback):
                raise HealthCheckError(
                    f"health check {name} returned {verdict!r} on {source} #{report.index}; "
                    "a check must return None or train.Rollback(reason, to_checkpoint=None)"
                )
            return Fired(name, verdict, report)
        history.append(report)
        return None
