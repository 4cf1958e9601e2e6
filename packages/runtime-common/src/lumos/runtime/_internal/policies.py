"""Failure and scaling policies: small objects that return a decision (no Ray)."""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Union

from lumos.runtime._internal.errors import RemoteError, RuntimeConfigError


class FailureKind(enum.Enum):
    """Why a worker failed."""

    USER_ERROR = "user_error"
    """The user function raised."""
    ACTOR_DIED = "actor_died"
    """The worker process is gone (killed, OOM, node lost)."""
    HUNG = "hung"
    """The worker stopped answering health checks."""
    START_FAILED = "start_failed"
    """The worker group could not be started (placement, actor start or backend set-up);
    the failure's message says which step failed and why."""


@dataclass(frozen=True)
class WorkerFailure:
    """One worker's failure, as given to ``FailurePolicy.make_decision``.

    Attributes:
        rank: World rank of the worker (-1 when not about one worker, e.g. a group start).
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
    """The failure policy's answer; it carries its own explanation.

    Attributes:
        action: ``FailureAction.RETRY`` or ``FailureAction.RAISE`` (also reachable as
            ``FailureDecision.RETRY`` / ``FailureDecision.RAISE``).
        reason: Human-readable why; when the limit is exceeded it names
            ``FailureConfig(max_failures=N)`` and the way out.
        failures: The failures count including this one.
        allowed: How many failures the policy tolerates (``None``: unlimited).
    """

    RETRY: ClassVar[FailureAction] = FailureAction.RETRY
    RAISE: ClassVar[FailureAction] = FailureAction.RAISE

    action: FailureAction
    reason: str
    failures: int = 0
    allowed: int | None = None

    @property
    def should_retry(self) -> bool:
        """True for RETRY."""
        return self.action is FailureAction.RETRY

    @property
    def progress(self) -> str:
        """``"failure 2 of 3"`` (or ``"failure 2 of unlimited"``), for console lines."""
        limit = "unlimited" if self.allowed is None else str(self.allowed)
        return f"failure {self.failures} of {limit}"


def describe_failures(failures: Sequence[WorkerFailure]) -> str:
    """One line naming every failed rank, its kind and message."""
    parts = []
    for f in failures:
        where = f"rank {f.rank}" if f.rank >= 0 else "group"
        text = f.message or (f"{f.error.exc_type}: {f.error.message}" if f.error else f.kind.value)
        parts.append(f"{where}: {f.kind.value} ({text})")
    return "; ".join(parts) if parts else "no details"


class FailurePolicy(ABC):
    """Decides RETRY or RAISE after a failure of a job (a Train run, a Tune trial).

    One call to ``make_decision`` is one failure of the job (however many workers
    failed together). Subclass it to plug in your own rule; a policy never does I/O.
    """

    @abstractmethod
    def make_decision(
        self, failures: Sequence[WorkerFailure], failures_so_far: int
    ) -> FailureDecision:
        """Decide what to do about ``failures``.

        Args:
            failures: The workers that failed this time (one or more).
            failures_so_far: Failures already handled before this one.

        Returns:
            The decision, with its reason.
        """


class DefaultFailurePolicy(FailurePolicy):
    """RETRY while the failures stay within ``max_failures``; user and system errors both count.

    Args:
        max_failures: Failures tolerated: ``-1`` unlimited, ``0`` none (fail at once),
            ``N`` retry up to N times.

    Example:
        >>> policy = DefaultFailurePolicy(max_failures=1)
        >>> f = [WorkerFailure(0, FailureKind.ACTOR_DIED, message="killed")]
        >>> policy.make_decision(f, failures_so_far=0).action
        <FailureAction.RETRY: 'retry'>
        >>> policy.make_decision(f, failures_so_far=1).action
        <FailureAction.RAISE: 'raise'>
    """

    def __init__(self, max_failures: int) -> None:
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < -1:
            raise RuntimeConfigError(
                f"max_failures={max_failures!r} is invalid: must be an int >= -1 (-1 = unlimited)"
            )
        self.max_failures = max_failures

    def make_decision(
        self, failures: Sequence[WorkerFailure], failures_so_far: int
    ) -> FailureDecision:
        """RETRY while the total stays within ``max_failures``, else RAISE."""
        if failures_so_far < 0:
            raise RuntimeConfigError(
                f"failures_so_far={failures_so_far!r} is invalid: must be >= 0"
            )
        total = failures_so_far + 1
        allowed = None if self.max_failures == -1 else self.max_failures
        what = describe_failures(failures)
        if allowed is None or total <= allowed:
            limit = "unlimited" if allowed is None else str(allowed)
            return FailureDecision(
                FailureAction.RETRY,
                f"failure {total} of {limit} allowed, retrying: {what}",
                total,
                allowed,
            )
        return FailureDecision(
            FailureAction.RAISE,
            f"exceeded FailureConfig(max_failures={self.max_failures}) after {total} failure(s); "
            f"last: {what}. Raise max_failures (-1 = unlimited) to retry more.",
            total,
            allowed,
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
            raise RuntimeConfigError(f"num_workers={num_workers!r} is invalid: must be an int >= 1")
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
            raise RuntimeConfigError(
                f"min_workers={self.min_workers!r} is invalid: must be an int >= 1"
            )
        if not isinstance(self.max_workers, int) or self.max_workers < self.min_workers:
            raise RuntimeConfigError(
                f"max_workers={self.max_workers!r} is invalid: must be an int >= min_workers ({self.min_workers})"
            )
        if not any(v > 0 for v in self.resources_per_worker.values()):
            raise RuntimeConfigError(
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
