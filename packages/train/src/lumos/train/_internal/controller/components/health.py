"""Health checks and rollback: a firing check sends training back to an earlier checkpoint.

``RunConfig(health_checks=...)`` run on each of rank 0's reports (``report_received``,
before the report can commit or reach a parent) and on each successful validation
(``validation_finished``), through the pure ``HealthMonitor``. A check that fires
is a :class:`~lumos.train._internal.controller.seam.RollbackRequest`; the backend
stops its ranks and asks :meth:`HealthComponent.plan` where to go back to, then has
the run core carry the plan out (``RunCore.roll_back``, which calls :meth:`apply`):
the later checkpoints are marked rolled back and renamed, and the next attempt
resumes from the target with ``RollbackInfo`` (``train.get_context()
.get_rollback_info()``). ``FailureConfig(max_rollbacks)`` bounds how often.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lumos.train._internal.controller import messages
from lumos.train._internal.controller.health_monitor import (
    Fired,
    HealthCheckError,
    HealthMonitor,
)
from lumos.train._internal.controller.seam import (
    Attempt,
    Component,
    RollbackRequest,
    RunBroken,
    RunHandle,
    Validated,
    Verdict,
)
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.health import RollbackInfo

if TYPE_CHECKING:
    from lumos.storage import CheckpointRecord, RunState
    from lumos.train._internal.health import HealthCheck
    from lumos.train._internal.wire import RankReport


@dataclass(frozen=True)
class RollbackPlan:
    """Where a fired check sends training, or why it cannot go back.

    Attributes:
        fired: The check that fired.
        target: The checkpoint to resume from (``None``: the start).
        error: Why the run fails instead (no rollback left, an unknown target).
        since: When the plan was made (``time.monotonic()``), for the console.
    """

    fired: Fired
    target: CheckpointRecord | None = None
    error: TrainConfigError | None = None
    since: float = field(default_factory=time.monotonic)

    @property
    def why(self) -> str:
        """``<check>: <reason>``, as the ended attempt records it."""
        return f"{self.fired.check}: {self.fired.rollback.reason}"


class HealthComponent(Component):
    """Runs the health checks and plans the rollbacks (see the module docstring).

    Args:
        run: The run core.
        checks: ``RunConfig.health_checks`` (none: the component does nothing).
        max_rollbacks: ``FailureConfig.max_rollbacks`` (``-1``: unlimited).
        history: Rank 0's stored report rows, which a resumed run's checks start from.
    """

    def __init__(
        self,
        run: RunHandle,
        checks: Sequence[HealthCheck],
        max_rollbacks: int,
        history: Callable[[], list[dict[str, Any]]],
    ) -> None:
        self._run = run
        self.monitor = HealthMonitor(checks, history()) if checks else None
        self.max_rollbacks = max_rollbacks
        self.rollbacks = 0  # in this fit()

    def attempt_started(self, attempt: Attempt) -> None:
        if self.monitor is not None:  # the reports from the resume point on come again
            self.monitor.rewind(attempt.base)

    def report_received(self, report: RankReport) -> Verdict | None:
        if self.monitor is None:
            return None
        monitor = self.monitor
        return _verdict(
            lambda: monitor.on_report(report.index, report.metrics, report.checkpoint_dir_name)
        )

    def validation_finished(self, validated: Validated) -> Verdict | None:
        record = validated.record
        if self.monitor is None or record is None or record.rolled_back:
            return None
        if validated.outcome.status != "validated":
            return None
        monitor = self.monitor
        return _verdict(
            lambda: monitor.on_validation(record.report_index, record.metrics, record.dir_name)
        )

    def plan(self, fired: Fired) -> RollbackPlan:
        """Where ``fired`` sends training: the named checkpoint, else the newest one
        committed before the bad report; an error when none may be used."""
        limit = self.max_rollbacks
        if 0 <= limit <= self.rollbacks:
            text = messages.rollbacks_exhausted_text(
                fired.check, fired.rollback.reason, fired.report.index, limit
            )
            return RollbackPlan(fired, error=TrainConfigError(text))
        live = self._run.book.state.live_checkpoints()
        name = fired.rollback.target_name()
        if name is None:
            before = [r for r in live if r.report_index < fired.report.index]
            target = max(before, key=lambda r: r.report_index) if before else None
            return RollbackPlan(fired, target)
        for record in live:
            if record.dir_name == name:
                return RollbackPlan(fired, record)
        return RollbackPlan(
            fired,
            error=TrainConfigError(
                f"health check {fired.check} returned Rollback(to_checkpoint={name!r}), "
                "which is not a committed checkpoint of this run that training can resume "
                f"from; those are: {[r.dir_name for r in live]}"
            ),
        )

    def apply(self, plan: RollbackPlan) -> None:
        """Mark the checkpoints after the target rolled back (renamed), and say so.

        Called by ``RunCore.roll_back`` once no rank writes any more.
        """
        fired, target = plan.fired, plan.target
        book = self._run.book
        record, dropped = book.rollback(
            fired.check, fired.rollback.reason, fired.report.index, target, fired.report.metrics
        )
        book.delete_dropped(dropped)
        self.rollbacks += 1
        self._run.console.info(
            messages.rollback_line(
                fired.check,
                fired.rollback.reason,
                fired.report.source,
                fired.report.index,
                target,
                record.rolled_back,
                self.rollbacks,
                self.max_rollbacks,
            )
        )


def rollback_info(state: RunState, resume: CheckpointRecord | None) -> RollbackInfo | None:
    """The run's last rollback, while an attempt resumes from where it went back to."""
    rollbacks = state.rollbacks
    if not rollbacks or rollbacks[-1].to_checkpoint != (resume.dir_name if resume else None):
        return None
    last = rollbacks[-1]
    return RollbackInfo(
        from_report=last.from_report,
        to_checkpoint=last.to_checkpoint,
        to_report_index=last.to_report_index,
        reason=last.reason,
        check=last.check,
        number=last.number,
        metrics=dict(last.metrics),
    )


def _verdict(check: Callable[[], Fired | None]) -> Verdict | None:
    try:
        fired = check()
    except HealthCheckError as error:  # a check raised or returned garbage
        return RunBroken(error)
    return RollbackRequest(fired) if fired is not None else None
