"""The resize policy: when a running group moves or grows, what a lost preempted rank costs."""

from __future__ import annotations

import pytest

from lumos.runtime import (
    FailureKind,
    MoveDecision,
    NoopDecision,
    ResizeDecision,
    ResizePolicy,
    RuntimeConfigError,
    WorkerFailure,
)


def test_a_notice_moves_the_noticed_ranks_at_the_checkpoint() -> None:
    elastic = ResizePolicy(elastic=True)
    fixed = ResizePolicy(elastic=False)
    notices = {2: "node draining", 0: "SIGTERM"}
    assert elastic.at_checkpoint(notices, grow_reason="room") == MoveDecision(
        "preemption notice (SIGTERM, node draining)", (0, 2), new_group=False
    )
    # a fixed-size group cannot drop ranks: it starts anew, off the draining nodes
    moved = fixed.at_checkpoint(notices, grow_reason=None)
    assert moved is not None
    assert moved.new_group
    assert moved.preempted == (0, 2)


def test_a_pending_grow_joins_at_the_checkpoint_and_nothing_else_moves() -> None:
    elastic = ResizePolicy(elastic=True)
    assert elastic.at_checkpoint({}, grow_reason="capacity for 1 more") == MoveDecision(
        "capacity for 1 more"
    )
    assert elastic.at_checkpoint({}, grow_reason=None) is None
    assert ResizePolicy(elastic=False).at_checkpoint({}, grow_reason="x") is None


def test_workers_to_start_counts_what_the_scaling_policy_wants_beyond_the_group() -> None:
    policy = ResizePolicy(elastic=True)
    assert policy.workers_to_start(ResizeDecision(4), world_size=2, group_size=2) == 2
    assert policy.workers_to_start(ResizeDecision(4), world_size=2, group_size=3) == 1
    assert policy.workers_to_start(ResizeDecision(2), world_size=2, group_size=2) == 0
    assert policy.workers_to_start(NoopDecision("full"), world_size=2, group_size=2) == 0
    assert ResizePolicy(elastic=False).workers_to_start(ResizeDecision(4), 2, 2) == 0
    assert policy.may_grow({})
    assert not policy.may_grow({1: "SIGTERM"})  # the notice is handled first


def test_size_after_loss_follows_the_scaling_decision() -> None:
    policy = ResizePolicy(elastic=True)
    assert policy.size_after_loss(NoopDecision(), group_size=3, lost=1) == 2
    assert policy.size_after_loss(ResizeDecision(3), group_size=3, lost=1) == 3


def _died(rank: int, kind: FailureKind = FailureKind.ACTOR_DIED) -> WorkerFailure:
    return WorkerFailure(rank, kind, message="gone")


def test_lost_preempted_ranks_use_their_own_budget() -> None:
    policy = ResizePolicy(elastic=True, max_preemption_failures=1)
    first = policy.lost_preempted([_died(1)], preempted={1}, so_far=0)
    assert first is not None
    assert first.should_retry
    assert first.progress == "failure 1 of 1"
    second = policy.lost_preempted([_died(1, FailureKind.HUNG)], preempted={1}, so_far=1)
    assert second is not None
    assert not second.should_retry
    assert "FailureConfig(max_preemption_failures=1)" in second.reason
    unlimited = ResizePolicy(elastic=False)
    decision = unlimited.lost_preempted([_died(0)], preempted={0}, so_far=99)
    assert decision is not None
    assert decision.should_retry


def test_any_other_failure_goes_to_the_failure_policy() -> None:
    policy = ResizePolicy(elastic=True)
    assert policy.lost_preempted([_died(1), _died(2)], preempted={1}, so_far=0) is None
    user_error = WorkerFailure(1, FailureKind.USER_ERROR, message="bad")
    assert policy.lost_preempted([user_error], preempted={1}, so_far=0) is None
    assert policy.lost_preempted([], preempted={1}, so_far=0) is None


@pytest.mark.parametrize("bad", [-2, 1.5, True, "1"])
def test_bad_budget_names_the_setting(bad: object) -> None:
    with pytest.raises(RuntimeConfigError, match="max_preemption_failures"):
        ResizePolicy(elastic=True, max_preemption_failures=bad)  # type: ignore[arg-type]
