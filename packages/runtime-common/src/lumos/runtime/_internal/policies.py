"""Failure and scaling policies: small objects that return a decision (no Ray)."""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Union

from lumos.runtime._internal.errors import RemoteError


class FailureKind(enum.Enum):
    """Why a worker failed."""

    USER_ERROR = "user_error"
    """The user function raised."""
    ACTOR_DIED = "actor_died"
    """The worker process is gone (killed, OOM, node lost)."""
    HUNG = "hung"
    """The worker stopped answering health checks."""
    SCHEDULING_TIMEOUT = "scheduling_timeout"
    """The workers could not be placed in time."""


@dataclass(frozen=True)
class WorkerFailure:
    """One worker's failure, as given to ``FailurePolicy.make_decision``.

    Attributes:
        rank: World rank of the worker (-1 when not about one worker, e.g. scheduling).
        kind: What went wrong.
        node_id: Node of the worker, when known.
        error: The remote error for USER_ERROR.
        message: One-line human description.
    """

    rank: int
    kind: FailureKind
    node_id: str | None = None
    error: RemoteError | None = None
    message: str = ""


class FailureAction(enum.Enum):
    """What to do after a failure."""

    RETRY = "retry"
    RAISE = "raise"


@dataclass(frozen=True)
class FailureDecision:
    """The failure policy's answer.

    Attributes:
        action: ``FailureAction.RETRY`` or ``FailureAction.RAISE`` (also reachable as
            ``FailureDecision.RETRY`` / ``FailureDecision.RAISE``).
        reason: Human-readable why; when the limit is exceeded it names
            ``FailureConfig(max_failures=N)``.
        failures: The failures count including this one.
    """

    RETRY: ClassVar[FailureAction] = FailureAction.RETRY
    RAISE: ClassVar[FailureAction] = FailureAction.RAISE

    action: FailureAction
    reason: str
    failures: int = 0

    @property
    def should_retry(self) -> bool:
        """True for RETRY."""
        return self.action is FailureAction.RETRY


def _describe(failures: list[WorkerFailure]) -> str:
    parts = []
    for f in failures:
        where = f"rank {f.rank}" if f.rank >= 0 else "group"
        text = f.message or (f"{f.error.exc_type}: {f.error.message}" if f.error else f.kind.value)
        parts.append(f"{where}: {f.kind.value} ({text})")
    return "; ".join(parts) if parts else "no details"


class FailurePolicy:
    """Decides RETRY or RAISE after a failure; user and system errors both count.

    One call to ``make_decision`` is one failure of the job (however many workers
    failed together).

    Args:
        max_failures: Failures tolerated: ``-1`` unlimited, ``0`` none (fail at once),
            ``N`` retry up to N times.

    Example:
        >>> policy = FailurePolicy(max_failures=1)
        >>> f = [WorkerFailure(0, FailureKind.ACTOR_DIED, message="killed")]
        >>> policy.make_decision(f, failures_so_far=0).action
        <FailureAction.RETRY: 'retry'>
        >>> policy.make_decision(f, failures_so_far=1).action
        <FailureAction.RAISE: 'raise'>
    """

    def __init__(self, max_failures: int) -> None:
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
            raise ValueError(
                f"max_failures={max_failures!r} is invalid: must be an int >= -1 (-1 = unlimited)"
            )
        self.max_failures = max_failures

    def make_decision(self, failures: list[WorkerFailure], failures_so_far: int) -> FailureDecision:
        """Decide what to do about ``failures``.

        Args:
            failures: The workers that failed this time (one or more).
            failures_so_far: Failures already handled before this one.

        Returns:
            RETRY while the total stays within ``max_failures``, else RAISE.
        """
        if failures_so_far < 0:
            raise ValueError(f"failures_so_far={failures_so_far!r} is invalid: must be >= 0")
        total = failures_so_far + 1
        what = _describe(failures)
        if self.max_failures == -1 or total <= self.max_failures:
            limit = "unlimited" if self.max_failures == -1 else str(self.max_failures)
            return FailureDecision(
                FailureAction.RETRY, f"failure {total} of {limit} allowed, retrying: {what}", total
            )
        return FailureDecision(
            FailureAction.RAISE,
            f"exceeded FailureConfig(max_failures={self.max_failures}) after {total} failure(s); "
            f"last: {what}. Raise max_failures (-1 = unlimited) to retry more.",
            total,
        )


@dataclass(frozen=True)
class NoopDecision:
    """Keep the current group size."""


@dataclass(frozen=True)
class ResizeDecision:
    """(Re)start the group with ``num_workers`` workers."""

    num_workers: int


ScalingDecision = Union[NoopDecision, ResizeDecision]  # noqa: UP007 - runtime alias (py3.10)


class ScalingPolicy(ABC):
    """Decides the group size from the current size and the free cluster resources."""

    @abstractmethod
    def make_decision(
        self, current_workers: int | None, available: dict[str, float]
    ) -> ScalingDecision:
        """Decide the size.

        Args:
            current_workers: Size of the running group, ``None`` when none runs.
            available: Free cluster resources (not counting the current group's).
        """


class FixedScalingPolicy(ScalingPolicy):
    """Always ``num_workers`` workers.

    Example:
        >>> FixedScalingPolicy(2).make_decision(None, {"CPU": 8})
        ResizeDecision(num_workers=2)
    """

    def __init__(self, num_workers: int) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} is invalid: must be an int >= 1")
        self.num_workers = num_workers

    def make_decision(
        self, current_workers: int | None, available: dict[str, float]
    ) -> ScalingDecision:
        if current_workers == self.num_workers:
            return NoopDecision()
        return ResizeDecision(self.num_workers)


@dataclass
class ElasticScalingPolicy(ScalingPolicy):
    """Between ``min_workers`` and ``max_workers``, as many as the free resources allow.

    When fewer than ``min_workers`` fit, it still asks for ``min_workers`` (the group
    waits for resources).

    Example:
        >>> p = ElasticScalingPolicy(1, 4, {"CPU": 2})
        >>> p.make_decision(None, {"CPU": 5})
        ResizeDecision(num_workers=2)
    """

    min_workers: int
    max_workers: int
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})

    def __post_init__(self) -> None:
        if (
            isinstance(self.min_workers, bool)
            or not isinstance(self.min_workers, int)
            or self.min_workers < 1
        ):
            raise ValueError(f"min_workers={self.min_workers!r} is invalid: must be an int >= 1")
        if not isinstance(self.max_workers, int) or self.max_workers < self.min_workers:
            raise ValueError(
                f"max_workers={self.max_workers!r} is invalid: must be an int >= min_workers ({self.min_workers})"
            )
        if not any(v > 0 for v in self.resources_per_worker.values()):
            raise ValueError(
                f"resources_per_worker={self.resources_per_worker!r} is invalid: need one amount > 0"
            )

    def fits(self, available: dict[str, float]) -> int:
        """How many more workers the free resources hold."""
        counts = [
            math.floor(float(available.get(k, 0.0)) / v + 1e-9)
            for k, v in self.resources_per_worker.items()
            if v > 0
        ]
        return max(0, min(counts))

    def make_decision(
        self, current_workers: int | None, available: dict[str, float]
    ) -> ScalingDecision:
        target = (current_workers or 0) + self.fits(available)
        target = max(self.min_workers, min(self.max_workers, target))
        if current_workers == target:
            return NoopDecision()
        return ResizeDecision(target)
