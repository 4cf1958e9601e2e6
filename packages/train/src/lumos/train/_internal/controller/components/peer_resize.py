"""Elastic runs under per-step fault tolerance: the group shrinks, grows and moves ranks
while the others train on.

An elastic group (``ScalingConfig(num_workers=(min, max))``) changes size at a checkpoint
boundary: every rank stops and the group relaunches at the new size from the latest
checkpoint (``elastic.py``). When every rank is its own torchft replica
(``TorchftConfig``), nobody needs to stop, and :class:`PeerResize` takes over the
elastic group's changes (``PeerRecovery`` launches the ranks that join):

* **A rank is lost** (:meth:`PeerResize.after_loss`): its worker leaves without any
  rank being re-numbered (``GroupDriver.vacate``: the survivors keep their world rank
  and their function), and as many lost ranks as the scaling policy finds room for get
  a new worker at once. The others stay vacant: the survivors train on at the smaller
  size. Fewer than ``min_workers`` left: the ordinary path (every rank restarts from
  the latest checkpoint once there is room).
* **Room comes back** (:meth:`PeerResize.step`, every
  ``elastic_resize_monitor_interval_s``): vacant ranks get a new worker first, then
  new ranks are added up to the scaling policy's size (``ResizePolicy.peer_joins``).
* **A preemption notice** (:meth:`PeerResize.step`; a fixed-size group too, whose
  losses are replaced as without an elastic size): the ranks under it move at once,
  not at the next checkpoint: a new worker starts elsewhere, then the old one ends and
  the new one takes its rank (``GroupDriver.refill`` of a live rank), before the
  deadline. A rank with nowhere to go yet is tried again every interval; if its node
  goes first, it is lost (above), and the loss counts against
  ``FailureConfig(max_preemption_failures)``.

Every rank that got a worker runs the training function again and takes its state from
a live peer at its first step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from lumos.runtime import FailureDecision, WorkerFailure
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.components.elastic import PLACE_S, ElasticComponent
from lumos.train._internal.controller.group import GroupDriver


class PeerResize:
    """The group's changes while its ranks train on: an elastic group's vacant ranks and
    growth, any group's moves (see the module docstring).

    Args:
        workers: The run's group driver.
        elastic: The run's elastic component (policies, notices, ``min_workers``); its
            own checkpoint-boundary grows and moves are turned off.
        console: Where state lines go.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        workers: GroupDriver,
        elastic: ElasticComponent,
        console: Console,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = workers
        self._elastic = elastic
        self._console = console
        self._clock = clock
        self._next_check = 0.0
        self._retry_at: dict[int, float] = {}  # a rank under a notice that found no room
        self.elastic = elastic.policy.elastic  # else: moves only (a fixed-size group)
        elastic.peer_moves = True

    def lost_decision(self, failures: Sequence[WorkerFailure]) -> FailureDecision | None:
        """The preemption budget's decision when only ranks under a notice were lost
        (counted once the recovery happened: :meth:`recovered_preemption`)."""
        elastic = self._elastic
        return elastic.policy.lost_preempted(failures, elastic.notices, elastic.preemptions)

    def recovered_preemption(self) -> None:
        """A loss of ranks under a notice was recovered from (the preemption budget)."""
        self._elastic.preemptions += 1

    def after_loss(self, ranks: list[int]) -> list[int] | None:
        """Vacate the lost ``ranks``; refill what fits now. Returns the ranks that got a
        new worker, or ``None`` when fewer than ``min_workers`` would train."""
        group = self._workers.current()
        size = len(group.workers)
        live = size - len(self._workers.vacant | set(ranks))
        if live < 1:
            return None
        self._workers.vacate(ranks)
        joined = self._fill()
        gone = sorted(self._workers.vacant)
        if gone:
            self._console.info(messages.vacant_line(gone, live + len(joined), size))
        self._next_check = self._clock() + self._elastic.interval_s
        if live + len(joined) < self._elastic.min_workers:
            return None
        return joined

    def step(self, running: set[int]) -> list[int]:
        """While training runs: move the ranks under a notice; every interval, refill
        vacant ranks or add new ones where the scaling policy finds room. Returns the
        ranks that got a new worker (launch them)."""
        now = self._clock()
        due = [
            r
            for r in sorted(self._elastic.notices)
            if r in running and self._retry_at.get(r, 0) <= now
        ]
        for rank in due:  # until it moved (no room elsewhere yet, a start failed)
            self._retry_at[rank] = now + self._elastic.interval_s
        joined = self._workers.refill(due, PLACE_S) if due else []
        if joined:
            self._console.info(messages.moved_live_line(joined))
            self._elastic.moved(self._workers.current())
            self._retry_at = {}
        if now < self._next_check or not self.elastic:
            return joined
        self._next_check = now + self._elastic.interval_s
        return joined + self._fill()

    def _fill(self) -> list[int]:
        """Refill vacant ranks, then add ranks, as far as the scaling policy finds room."""
        group = self._workers.current()
        vacant = sorted(self._workers.vacant)
        size = len(group.workers)
        decision = self._elastic.scaling.make_decision(
            group.scaling_state(lost_ranks=vacant), group.free_resources()
        )
        refill, add = self._elastic.policy.peer_joins(
            decision, size - len(vacant), len(vacant), size
        )
        # the policy saw room: placing takes a moment (training goes on meanwhile)
        joined = self._workers.refill(vacant[:refill], PLACE_S) if refill else []
        if add:
            joined += self._workers.add(add, PLACE_S)
        return joined
