"""When a running group resizes or moves, and what losing preempted ranks costs (pure).

``ScalingPolicy`` (``policies.py``) decides how many workers a group should have;
``ResizePolicy`` decides *when* a running job acts on that and on preemption notices,
and how many times preempted ranks may be lost. The owner (``lumos.train``'s elastic
component) keeps the facts — the ranks under a notice, the workers started ahead of
a grow, the preemptions recovered so far — and carries the decisions out. No Ray,
no clock, no I/O: every input is an argument.

* **Move** (:meth:`ResizePolicy.at_checkpoint`): right after a checkpoint commits,
  ranks under a preemption notice move (an elastic group drops them and refills, a
  fixed-size group starts anew), else workers started ahead join (the group grows).
* **Grow** (:meth:`ResizePolicy.workers_to_start`): while training runs, start the
  workers the scaling policy wants beyond the attempt's size; they join at the next
  checkpoint, so no reported step is lost.
* **Loss** (:meth:`ResizePolicy.lost_preempted`): when only ranks under a notice died,
  the loss counts against ``max_preemption_failures``, not ``max_failures``.
* **Joins** (:meth:`ResizePolicy.peer_joins`): when ranks join a running attempt and
  take their state from a live peer (per-step fault tolerance), no checkpoint boundary
  is needed: lost ranks stay vacant, and vacant ranks are refilled, or new ranks added,
  as soon as the scaling policy finds room.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from lumos.runtime._internal.errors import RuntimeConfigError
from lumos.runtime._internal.policies import (
    FailureAction,
    FailureDecision,
    FailureKind,
    NoopDecision,
    ResizeDecision,
    ScalingDecision,
    WorkerFailure,
)

_LOST = (FailureKind.ACTOR_DIED, FailureKind.HUNG)


@dataclass(frozen=True)
class MoveDecision:
    """Change the group now, at a checkpoint boundary.

    Attributes:
        reason: Why, in one line (the console and the attempt record show it).
        preempted: Ranks under a preemption notice: they leave the group.
        new_group: Start a new group (a fixed-size group moves off draining nodes);
            ``False``: drop ``preempted`` and refill or grow the running group.
    """

    reason: str
    preempted: tuple[int, ...] = ()
    new_group: bool = False


class ResizePolicy:
    """Decides when a running group changes and what a lost preempted rank costs.

    Subclass it to change one rule; a policy never does I/O.

    Args:
        elastic: Whether the group may change size (``ScalingConfig(num_workers=(a, b))``).
        max_preemption_failures: Losses of ranks under a preemption notice the job
            recovers from, apart from ``max_failures`` (``-1``: unlimited).

    Example:
        >>> policy = ResizePolicy(elastic=True)
        >>> policy.at_checkpoint({1: "node draining"}, grow_reason=None)
        MoveDecision(reason='preemption notice (node draining)', preempted=(1,), new_group=False)
        >>> policy.workers_to_start(ResizeDecision(3), world_size=2, group_size=2)
        1
    """

    def __init__(self, *, elastic: bool, max_preemption_failures: int = -1) -> None:
        limit = max_preemption_failures
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
            raise RuntimeConfigError(
                f"max_preemption_failures={limit!r} is invalid: must be an int >= -1 "
                "(-1 = unlimited)"
            )
        self.elastic = elastic
        self.max_preemption_failures = limit

    def at_checkpoint(
        self, notices: Mapping[int, str], grow_reason: str | None
    ) -> MoveDecision | None:
        """What to do right after a checkpoint committed.

        Args:
            notices: Rank -> reason of each preemption notice still out.
            grow_reason: Why extra workers were started ahead, if they were.

        Returns:
            The move to make now, or ``None`` (training goes on).
        """
        if notices:
            reasons = ", ".join(sorted(set(notices.values())))
            return MoveDecision(
                f"preemption notice ({reasons})",
                tuple(sorted(notices)),
                new_group=not self.elastic,
            )
        if grow_reason is not None and self.elastic:
            return MoveDecision(grow_reason)
        return None

    def may_grow(self, notices: Mapping[int, str]) -> bool:
        """Whether a running group asks the scaling policy for more workers now."""
        return self.elastic and not notices

    def workers_to_start(self, decision: ScalingDecision, world_size: int, group_size: int) -> int:
        """How many workers to start ahead of a grow (0: none).

        Args:
            decision: The scaling policy's answer for the running group.
            world_size: Ranks of the running attempt.
            group_size: Workers in the group now (some may already wait to join).
        """
        if not self.may_grow({}) or not isinstance(decision, ResizeDecision):
            return 0
        if decision.num_workers <= world_size:
            return 0
        return max(0, decision.num_workers - group_size)

    def size_after_loss(self, decision: ScalingDecision, group_size: int, lost: int) -> int:
        """The size to refill toward once ``lost`` ranks left a group of ``group_size``."""
        if isinstance(decision, NoopDecision):
            return group_size - lost
        return decision.num_workers

    def peer_joins(
        self, decision: ScalingDecision, live: int, vacant: int, group_size: int
    ) -> tuple[int, int]:
        """How many ranks join a running attempt now, when a joining rank takes its state
        from a live peer (per-step fault tolerance): ``(vacant ranks to refill, ranks to
        add)``.

        Args:
            decision: The scaling policy's answer (vacant ranks counted as lost).
            live: Ranks that have a worker.
            vacant: Ranks that have none (lost, not refilled yet).
            group_size: Every rank, vacant ones included.

        Example:
            >>> ResizePolicy(elastic=True).peer_joins(ResizeDecision(3), 2, 1, 3)
            (1, 0)
        """
        if not self.elastic or not isinstance(decision, ResizeDecision):
            return 0, 0
        more = max(0, decision.num_workers - live)
        refill = min(more, vacant)
        add = max(0, decision.num_workers - group_size) if refill == vacant else 0
        return refill, add

    def lost_preempted(
        self, failures: Sequence[WorkerFailure], preempted: Collection[int], so_far: int
    ) -> FailureDecision | None:
        """The decision when every failure is the loss of a rank under a notice.

        Args:
            failures: The failures of this attempt.
            preempted: Ranks under a preemption notice.
            so_far: Such losses recovered from before this one.

        Returns:
            RETRY or RAISE by ``max_preemption_failures``; ``None`` when any failure is
            something else (the failure policy decides then).
        """
        if not failures or not all(f.rank in preempted and f.kind in _LOST for f in failures):
            return None
        used = so_far + 1
        limit = self.max_preemption_failures
        allowed = None if limit < 0 else limit
        if allowed is not None and used > allowed:
            return FailureDecision(
                FailureAction.RAISE,
                f"ranks under a preemption notice were lost {used} time(s), more than "
                f"FailureConfig(max_preemption_failures={limit}); raise it (-1 = unlimited)",
                used,
                allowed,
            )
        return FailureDecision(FailureAction.RETRY, "preempted ranks were lost", used, allowed)
