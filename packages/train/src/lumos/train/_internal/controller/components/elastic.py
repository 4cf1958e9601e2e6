"""Elastic resizing and preemption moves of the Ray backend's worker group.

The component keeps what the controller knows between decisions — the ranks under a
preemption notice, whether extra workers wait to join, the preemptions recovered so
far — and carries out what the runtime's policies decide: ``ScalingPolicy`` the size,
``ResizePolicy`` when the group changes and what a lost preempted rank costs.
``GroupDriver`` does the group operations.

* **Grow**: every ``elastic_resize_monitor_interval_s`` the scaling policy is asked;
  when more workers fit, they start right away (``add_workers``: they idle, training
  goes on) and the ranks relaunch at the larger size right after the next committed
  checkpoint (``report_committed`` marks the boundary), so no reported step is lost.
* **Preemption**: a notice (a draining node, a SIGTERM to a worker) is not a failure.
  The training function sees it (``train.get_preemption_info()``) and checkpoints;
  right after that checkpoint commits, the affected ranks move: an elastic group drops
  them and refills where the policy finds room, a fixed-size group starts anew.
* **Loss** of an elastic group's ranks: they are dropped and refilled where capacity
  exists, else training goes on with fewer (never below ``min_workers``: it waits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lumos.runtime import (
    FailureDecision,
    MoveDecision,
    ResizeDecision,
    ResizePolicy,
    ScalingPolicy,
    WorkerFailure,
    WorkerGroupProtocol,
    WorkerPreemptedEvent,
)
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.group import GroupDriver
from lumos.train._internal.controller.seam import Attempt, Committed, Component

PLACE_S = 5.0
"""How long a grow waits for the new workers' placement (the policy saw free room)."""

StopCheck = Callable[[], "BaseException | None"]
"""Returns the error to stop the run with (the parent job stopped it), else ``None``."""


class ElasticComponent(Component):
    """The group's preemption notices and pending growth (see the module docstring).

    Args:
        workers: The run's group driver.
        console: Where state lines go.
        policy: When the group changes; the preemption budget.
        scaling: The size (``ElasticScalingPolicy`` / ``FixedScalingPolicy``).
        interval_s: How often a running elastic group asks ``scaling`` whether to grow.
        min_workers: The fewest workers an elastic group runs with.
        placement_timeout_s: How long a group below ``min_workers`` waits for room.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        workers: GroupDriver,
        console: Console,
        *,
        policy: ResizePolicy,
        scaling: ScalingPolicy,
        interval_s: float,
        min_workers: int = 1,
        placement_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = workers
        self._console = console
        self.policy = policy
        self.scaling = scaling
        self.interval_s = interval_s
        self.min_workers = min_workers
        self._placement_timeout_s = placement_timeout_s
        self._clock = clock
        self._next_check = clock() + interval_s
        self._world_size = 0
        self._boundary = False  # a checkpoint committed since the last step()
        self.notices: dict[int, WorkerPreemptedEvent] = {}
        self.grow_reason: str | None = None
        self.preemptions = 0  # losses of preempted ranks recovered from
        self.peer_moves = False  # ranks join while the others train (peer_resize.py)

    # -- seam ---------------------------------------------------------------------------
    def attempt_started(self, attempt: Attempt) -> None:
        self._world_size = attempt.world_size
        self._boundary = False

    def report_committed(self, committed: Committed) -> None:
        self._boundary = True

    # -- what the controller asks ---------------------------------------------------------
    def on_preempted(self, event: WorkerPreemptedEvent) -> None:
        """Record a notice (not a failure); the first one for a rank is said on the console."""
        new = event.rank not in self.notices
        self.notices[event.rank] = event
        if not new:
            return
        left = None
        if event.deadline_ms is not None:
            left = max(0.0, event.deadline_ms / 1000.0 - time.time())
        line = messages.preempted_line(
            event.rank, event.node_id, event.reason, left, self.peer_moves
        )
        self._console.info(line)

    def lost_decision(self, failures: Sequence[WorkerFailure]) -> FailureDecision | None:
        """The preemption budget's decision when only ranks under a notice were lost."""
        decision = self.policy.lost_preempted(failures, self.notices, self.preemptions)
        if decision is not None and decision.should_retry:
            self.preemptions += 1
        return decision

    def step(self) -> MoveDecision | None:
        """While training runs: grow in the background; right after a commit, the move
        (none with ``peer_moves``: ``PeerResize`` changes the group while ranks train)."""
        if self.peer_moves:
            return None
        self._maybe_grow(self._workers.current())
        boundary, self._boundary = self._boundary, False
        if not boundary:
            return None
        return self.policy.at_checkpoint(self._reasons(), self.grow_reason)

    def move(
        self, move: MoveDecision, ended: frozenset[int], world_size: int, stop: StopCheck
    ) -> bool:
        """Stop the ranks and carry ``move`` out; ``False``: start a new group."""
        try:
            dead = self._workers.wind_down(set(range(world_size)) - ended)
        except TimeoutError as exc:
            self._console.info(messages.replace_failed_line(exc))
            self.moved(None)
            return False
        if move.new_group:  # a fixed-size group moves by starting anew (off draining nodes)
            self._console.info(messages.moving_line(move.reason))
            self.moved(None)
            return False
        self._change_size(sorted(set(move.preempted) | dead), move.reason, world_size, stop)
        self.moved(self._workers.current())
        return True

    def after_loss(
        self, dead: list[int], ended: frozenset[int], world_size: int, stop: StopCheck
    ) -> bool:
        """An elastic group drops its lost ranks and refills; ``False``: start anew."""
        try:
            waiting = set(range(world_size)) - set(dead) - ended
            lost = sorted(set(dead) | self._workers.wind_down(waiting))
            self._change_size(lost, "worker(s) lost" if lost else "restart", world_size, stop)
            self.moved(self._workers.current())
        except Exception as exc:
            self._console.info(messages.replace_failed_line(exc))
            return False
        return True

    def moved(self, group: WorkerGroupProtocol | None) -> None:
        """The group changed: pending growth is settled, and the notices are those the
        (re-numbered) ``group`` still has (``None``: a new group, no notices yet)."""
        self.notices.clear()
        info = group.preemption_info() if group is not None else None
        if group is not None and info is not None:
            for node, ranks in info.preempted_node_to_ranks.items():
                for rank in ranks:
                    if rank < len(group.workers):
                        self.notices[rank] = WorkerPreemptedEvent(
                            rank, node, info.deadline_ms, "earlier notice"
                        )
        self.grow_reason = None
        self._next_check = self._clock() + self.interval_s

    # -- helpers ------------------------------------------------------------------------
    def _reasons(self) -> dict[int, str]:
        return {rank: event.reason for rank, event in self.notices.items()}

    def _maybe_grow(self, group: WorkerGroupProtocol) -> None:
        if not self.policy.may_grow(self._reasons()):
            return
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self.interval_s
        decision = self.scaling.make_decision(group.scaling_state(), group.free_resources())
        if not isinstance(decision, ResizeDecision) or decision.num_workers <= self._world_size:
            return
        missing = self.policy.workers_to_start(decision, self._world_size, len(group.workers))
        # the policy saw room: placing takes a moment (bounded; training goes on meanwhile)
        added = len(group.add_workers(missing, timeout_s=PLACE_S).added) if missing else 0
        extra = len(group.workers) - self._world_size
        if extra > 0:
            self.grow_reason = messages.grow_reason_text(extra, decision.reason)
        if added:
            self._console.info(
                messages.grow_started_line(added, self._world_size, len(group.workers))
            )

    def _change_size(self, lost: list[int], reason: str, before: int, stop: StopCheck) -> None:
        """Drop ``lost`` ranks of the elastic group; refill toward the policy's size."""
        group = self._workers.current()
        decision = self.scaling.make_decision(
            group.scaling_state(lost_ranks=lost), group.free_resources()
        )
        target = self.policy.size_after_loss(decision, len(group.workers), len(lost))
        _, after, seconds = self._workers.resize(lost, target, wait_s=PLACE_S)
        waited = 0.0
        while after < self.min_workers and stop() is None:  # wait for capacity
            self._console.info(messages.waiting_min_workers_line(after, self.min_workers))
            _, after, more = self._workers.resize([], self.min_workers, wait_s=10.0)
            waited += more
            timeout = self._placement_timeout_s
            if timeout is not None and waited >= timeout:
                raise TimeoutError(
                    f"the elastic group stayed below min_workers={self.min_workers} for "
                    f"{waited:.0f} s (placement_timeout_s={timeout})"
                )
        self._console.info(messages.resize_line(reason, before, after, seconds + waited))
