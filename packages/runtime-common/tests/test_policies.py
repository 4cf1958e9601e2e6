from __future__ import annotations

import pytest

from lumos.runtime import (
    DefaultFailurePolicy,
    FailureAction,
    FailureDecision,
    FailureKind,
    FixedScalingPolicy,
    FreeResources,
    GroupState,
    NoopDecision,
    RemoteError,
    ResizeDecision,
    WorkerFailure,
)


def _died(rank: int = 0) -> list[WorkerFailure]:
    return [WorkerFailure(rank, FailureKind.ACTOR_DIED, "node-1", None, "SIGKILL")]


def _user_error() -> list[WorkerFailure]:
    err = RemoteError.from_exception(ValueError("nan loss"), rank=1)
    return [WorkerFailure(1, FailureKind.USER_ERROR, None, err, "")]


def test_max_failures_zero_raises_at_first_failure_and_names_the_config() -> None:
    decision = DefaultFailurePolicy(0).make_decision(_died(), failures_so_far=0)
    assert decision.action is FailureAction.RAISE
    assert decision.action is FailureDecision.RAISE
    assert not decision.should_retry
    assert "FailureConfig(max_failures=0)" in decision.reason
    assert "SIGKILL" in decision.reason


def test_retries_up_to_max_failures_then_raises() -> None:
    policy = DefaultFailurePolicy(2)
    assert policy.make_decision(_died(), 0).action is FailureAction.RETRY
    assert policy.make_decision(_user_error(), 1).action is FailureAction.RETRY
    last = policy.make_decision(_died(), 2)
    assert last.action is FailureAction.RAISE
    assert last.failures == 3
    assert "FailureConfig(max_failures=2)" in last.reason


@pytest.mark.parametrize("kind", list(FailureKind))
def test_every_failure_kind_counts(kind: FailureKind) -> None:
    policy = DefaultFailurePolicy(1)
    f = [WorkerFailure(0, kind, None, None, "x")]
    assert policy.make_decision(f, 0).should_retry
    assert not policy.make_decision(f, 1).should_retry


def test_user_error_reason_shows_exception_type_and_message() -> None:
    decision = DefaultFailurePolicy(0).make_decision(_user_error(), 0)
    assert "builtins.ValueError: nan loss" in decision.reason
    assert "rank 1" in decision.reason


def test_unlimited_always_retries() -> None:
    policy = DefaultFailurePolicy(-1)
    for so_far in (0, 10, 10_000):
        assert policy.make_decision(_died(), so_far).action is FailureAction.RETRY


@pytest.mark.parametrize("bad", [-2, 1.5, "3", True])
def test_invalid_max_failures_names_field(bad: object) -> None:
    with pytest.raises(ValueError, match="max_failures"):
        DefaultFailurePolicy(bad)  # type: ignore[arg-type]


def test_negative_failures_so_far_rejected() -> None:
    with pytest.raises(ValueError, match="failures_so_far"):
        DefaultFailurePolicy(1).make_decision(_died(), -1)


def test_fixed_scaling() -> None:
    policy = FixedScalingPolicy(4)
    assert policy.make_decision(GroupState(0, 4, 4), FreeResources()) == ResizeDecision(
        4, "fixed size: 4 worker(s)"
    )
    assert policy.make_decision(GroupState(4, 4, 4), FreeResources()) == NoopDecision()
    lost = GroupState(4, 4, 4, lost_ranks=(1,))
    assert policy.make_decision(lost, FreeResources()).num_workers == 4  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="num_workers"):
        FixedScalingPolicy(0)
