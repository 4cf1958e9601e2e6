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
class GroupState:
    """What a scaling policy knows about the worker group.

    Attributes:
        num_workers: Workers in the group now (0: no group runs).
        min_workers: The fewest the job may run with.
        max_workers: The most it may use.
        resources_per_worker: Ray resources one worker needs.
        preempted_ranks: Ranks under a preemption notice (they will go away).
        lost_ranks: Ranks whose worker just failed and is not replaced yet.
    """

    num_workers: int
    min_workers: int
    max_workers: int
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    preempted_ranks: tuple[int, ...] = ()
    lost_ranks: tuple[int, ...] = ()

    @property
    def usable_workers(self) -> int:
        """Workers that stay: neither lost nor preempted."""
        return self.num_workers - len(set(self.preempted_ranks) | set(self.lost_ranks))


@dataclass(frozen=True)
class FreeResources:
    """Free resources of the schedulable nodes (draining nodes left out).

    Attributes:
        per_node: Node id -> free amounts (``{"CPU": 2.0, "GPU": 1.0, ...}``).
        draining: Draining node id -> deadline in ms (0: none); they take no new work.

    Example:
        >>> free = FreeResources({"a": {"CPU": 3}, "b": {"CPU": 1.5}})
        >>> free.workers_that_fit({"CPU": 1})
        4
    """

    per_node: dict[str, dict[str, float]] = field(default_factory=dict)
    draining: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> dict[str, float]:
        """Free amounts summed over the nodes."""
        out: dict[str, float] = {}
        for res in self.per_node.values():
            for k, v in res.items():
                out[k] = out.get(k, 0.0) + float(v)
        return out

    def workers_that_fit(self, resources_per_worker: dict[str, float]) -> int:
        """How many more workers fit, node by node (a worker never spans nodes)."""
        needs = {k: float(v) for k, v in resources_per_worker.items() if v > 0}
        if not needs:
            return 0
        fit = 0
        for res in self.per_node.values():
            fit += max(
                0, min(math.floor(float(res.get(k, 0.0)) / v + 1e-9) for k, v in needs.items())
            )
        return fit


@dataclass(frozen=True)
class NoopDecision:
    """Keep the group as it is.

    Attributes:
        reason: Why (for logs; may be empty).
    """

    reason: str = ""


@dataclass(frozen=True)
class ResizeDecision:
    """Run the group with ``num_workers`` workers, none of them lost or preempted.

    The owner removes the lost and preempted ranks (``WorkerGroup.remove_workers``) and
    adds ``num_workers - usable`` new ones (``WorkerGroup.add_workers``), or removes
    more when ``num_workers`` is below the usable count.

    Attributes:
        num_workers: The size to reach.
        reason: Why, in one line (the console prints it).
    """

    num_workers: int
    reason: str = ""


ScalingDecision = Union[NoopDecision, ResizeDecision]  # noqa: UP007 - runtime alias (py3.10)


class ScalingPolicy(ABC):
    """Decides the group size from the group's state and the cluster's free resources.

    The owner asks at start, after a worker is lost or preempted, and every monitor
    interval while the group runs. Subclass it for your own rule; a policy never does
    I/O (``WorkerGroup.free_resources()`` reads the cluster).
    """

    @abstractmethod
    def make_decision(self, group: GroupState, free: FreeResources) -> ScalingDecision:
        """Decide the size.

        Args:
            group: The group now (``num_workers == 0`` before it starts).
            free: Free resources of the schedulable nodes, not counting the group's own.
        """


class FixedScalingPolicy(ScalingPolicy):
    """Always ``num_workers`` workers (lost or preempted ones are replaced).

    Example:
        >>> FixedScalingPolicy(2).make_decision(GroupState(0, 2, 2), FreeResources())
        ResizeDecision(num_workers=2, reason='fixed size: 2 worker(s)')
    """

    def __init__(self, num_workers: int) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise RuntimeConfigError(f"num_workers={num_workers!r} is invalid: must be an int >= 1")
        self.num_workers = num_workers

    def make_decision(self, group: GroupState, free: FreeResources) -> ScalingDecision:
        if group.usable_workers == self.num_workers == group.num_workers:
            return NoopDecision()
        return ResizeDecision(self.num_workers, f"fixed size: {self.num_workers} worker(s)")


class ElasticScalingPolicy(ScalingPolicy):
    """Between ``min_workers`` and ``max_workers``, as many as the free resources hold.

    Lost and preempted ranks do not count as usable; their places are refilled when
    capacity exists (a preempted node takes no new work, so its ranks move). When
    fewer than ``min_workers`` fit, it still asks for ``min_workers``: the owner waits
    for resources. It grows only by ``min_grow`` workers or more at a time (a resize
    costs a restart from the latest checkpoint).

    Args:
        min_grow: Grow a running group only when at least this many more fit (>= 1).

    Example:
        >>> p = ElasticScalingPolicy()
        >>> state = GroupState(2, min_workers=2, max_workers=4)
        >>> p.make_decision(state, FreeResources({"n2": {"CPU": 1}})).num_workers
        3
    """

    def __init__(self, min_grow: int = 1) -> None:
        if isinstance(min_grow, bool) or not isinstance(min_grow, int) or min_grow < 1:
            raise RuntimeConfigError(f"min_grow={min_grow!r} is invalid: must be an int >= 1")
        self.min_grow = min_grow

    def make_decision(self, group: GroupState, free: FreeResources) -> ScalingDecision:
        if not 1 <= group.min_workers <= group.max_workers:
            raise RuntimeConfigError(
                f"GroupState(min_workers={group.min_workers}, max_workers={group.max_workers}) "
                "is invalid: need 1 <= min_workers <= max_workers"
            )
        usable = group.usable_workers
        fit = free.workers_that_fit(group.resources_per_worker)
        target = max(group.min_workers, min(group.max_workers, usable + fit))
        gone = sorted(set(group.preempted_ranks) | set(group.lost_ranks))
        if not gone:
            if target == group.num_workers:
                return NoopDecision(f"{group.num_workers} worker(s); {fit} more fit")
            if 0 < group.num_workers < target < group.num_workers + self.min_grow:
                return NoopDecision(f"only {fit} more fit; min_grow={self.min_grow}")
        if usable + fit < group.min_workers:
            why = (
                f"below min_workers={group.min_workers}: {usable} usable, room for {fit} more; "
                "waiting for resources"
            )
        elif group.num_workers == 0:
            why = f"start: {fit} worker(s) fit, max_workers={group.max_workers}"
        elif gone:
            why = f"rank(s) {gone} lost or preempted; {usable} remain and {fit} more fit"
        else:
            why = f"{fit} more worker(s) fit (max_workers={group.max_workers})"
        return ResizeDecision(target, f"{group.num_workers} -> {target} worker(s): {why}")
