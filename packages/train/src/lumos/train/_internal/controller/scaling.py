"""Elastic resizing and preemption moves of the training group (the controller's side).

``Resizer`` keeps what the controller knows between decisions: the ranks under a
preemption notice, and whether the group should change at the next checkpoint
boundary. The runtime's ``ScalingPolicy`` decides the size from the group's state and
the cluster's free resources; ``GroupDriver.resize`` carries the decision out.

* **Grow**: every ``elastic_resize_monitor_interval_s`` the policy is asked; when more
  workers fit, they are started right away (``add_workers``: they idle, training goes
  on) and the ranks relaunch at the larger size right after the next committed
  checkpoint, so no reported step is lost and the start-up cost is hidden.
* **Preemption**: a notice (a draining node, a SIGTERM to a worker) is not a failure.
  The training function sees it (``train.get_preemption_info()``) and checkpoints; right
  after that checkpoint commits, the affected ranks move: an elastic group drops them
  and refills from other nodes where the policy finds room, a fixed-size group starts
  anew (Ray places it away from draining nodes).
* **Loss** (a worker or node died) of an elastic group: the dead ranks are dropped,
  and refilled where capacity exists, else training continues with fewer (never fewer
  than ``min_workers``: below that it waits for resources).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lumos.runtime import (
    NoopDecision,
    ResizeDecision,
    ScalingPolicy,
    WorkerGroupProtocol,
    WorkerPreemptedEvent,
)

PLACE_S = 5.0
"""How long a grow waits for the new workers' placement (the policy saw free room)."""


@dataclass(frozen=True)
class Move:
    """Why the group changes at the next checkpoint boundary."""

    reason: str
    preempted: tuple[int, ...] = ()


class Resizer:
    """The controller's memory of preemptions and pending growth (see the module docstring).

    Args:
        policy: Decides the size (``ElasticScalingPolicy`` / ``FixedScalingPolicy``).
        elastic: Whether the group may change size.
        interval_s: How often a running elastic group asks the policy whether to grow.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        policy: ScalingPolicy,
        *,
        elastic: bool,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.elastic = elastic
        self.interval_s = interval_s
        self._clock = clock
        self._next_check = clock() + interval_s
        self.preempted: dict[int, WorkerPreemptedEvent] = {}
        self.grow_reason: str | None = None

    def on_preempted(self, event: WorkerPreemptedEvent) -> bool:
        """Record a notice; True when it is new for that rank."""
        new = event.rank not in self.preempted
        self.preempted[event.rank] = event
        return new

    def pending(self) -> Move | None:
        """The move to make at the next checkpoint boundary, if any."""
        if self.preempted:
            ranks = tuple(sorted(self.preempted))
            reasons = sorted({e.reason for e in self.preempted.values()})
            return Move(f"preemption notice ({', '.join(reasons)})", ranks)
        if self.grow_reason is not None:
            return Move(self.grow_reason)
        return None

    def maybe_grow(self, group: WorkerGroupProtocol, world_size: int) -> int:
        """Every interval: start the workers the policy wants beyond ``world_size``.

        Returns:
            How many workers were started now (they join at the next checkpoint).
        """
        if not self.elastic or self.preempted:
            return 0
        now = self._clock()
        if now < self._next_check:
            return 0
        self._next_check = now + self.interval_s
        decision = self.policy.make_decision(group.scaling_state(), group.free_resources())
        if not isinstance(decision, ResizeDecision) or decision.num_workers <= world_size:
            return 0
        missing = decision.num_workers - len(group.workers)
        # the policy saw room: placing takes a moment (bounded; training goes on meanwhile)
        added = len(group.add_workers(missing, timeout_s=PLACE_S).added) if missing > 0 else 0
        if len(group.workers) > world_size:
            self.grow_reason = (
                f"capacity for {len(group.workers) - world_size} more worker(s) ({decision.reason})"
            )
        return added

    def target(self, group: WorkerGroupProtocol, lost: list[int]) -> int:
        """How many workers the group should have once ``lost`` ranks are gone."""
        decision = self.policy.make_decision(
            group.scaling_state(lost_ranks=lost), group.free_resources()
        )
        if isinstance(decision, NoopDecision):
            return len(group.workers) - len(lost)
        return decision.num_workers

    def moved(self, group: WorkerGroupProtocol | None) -> None:
        """The group changed: pending growth is settled, and the notices are those the
        (re-numbered) ``group`` still has (``None``: a new group, no notices yet)."""
        self.preempted.clear()
        info = group.preemption_info() if group is not None else None
        if info is not None:
            for node, ranks in info.preempted_node_to_ranks.items():
                for rank in ranks:
                    if rank < len(group.workers):  # type: ignore[union-attr]
                        self.preempted[rank] = WorkerPreemptedEvent(
                            rank, node, info.deadline_ms, "earlier notice"
                        )
        self.grow_reason = None
        self._next_check = self._clock() + self.interval_s
