"""The elastic scaling policy and its inputs (pure: no Ray)."""

from __future__ import annotations

import pytest

from lumos.runtime import (
    ElasticScalingPolicy,
    FreeResources,
    GroupState,
    NoopDecision,
    PreemptionInfo,
    ResizeDecision,
    ScalingDecision,
    ScalingPolicy,
)
from lumos.runtime._internal.preemption import merge_preemption_info

GPU_WORKER = {"CPU": 2.0, "GPU": 1.0}


def _state(n: int, lo: int = 2, hi: int = 6, **kw: object) -> GroupState:
    return GroupState(n, lo, hi, dict(GPU_WORKER), **kw)  # type: ignore[arg-type]


def test_workers_that_fit_count_node_by_node() -> None:
    free = FreeResources({"a": {"CPU": 4, "GPU": 1}, "b": {"CPU": 1, "GPU": 4}, "c": {"CPU": 8}})
    # a: GPU limits to 1; b: CPU limits to 0; c: no GPU -> 0. The totals (13 CPU, 5 GPU) would say 5.
    assert free.workers_that_fit(GPU_WORKER) == 1
    assert free.total == {"CPU": 13.0, "GPU": 5.0}
    assert FreeResources().workers_that_fit(GPU_WORKER) == 0


def test_elastic_start_takes_what_fits_between_min_and_max() -> None:
    policy = ElasticScalingPolicy()
    three = FreeResources({f"n{i}": {"CPU": 2, "GPU": 1} for i in range(3)})
    assert policy.make_decision(_state(0), three).num_workers == 3  # type: ignore[union-attr]
    plenty = FreeResources({"big": {"CPU": 100, "GPU": 100}})
    assert policy.make_decision(_state(0), plenty).num_workers == 6  # type: ignore[union-attr]
    # fewer than min fit: ask for min, and say it waits
    decision = policy.make_decision(_state(0), FreeResources({"a": {"CPU": 2, "GPU": 1}}))
    assert isinstance(decision, ResizeDecision)
    assert decision.num_workers == 2
    assert "below min_workers=2" in decision.reason
    assert "waiting for resources" in decision.reason


def test_running_group_keeps_size_without_room_and_grows_with_room() -> None:
    policy = ElasticScalingPolicy()
    assert isinstance(policy.make_decision(_state(3), FreeResources()), NoopDecision)
    grow = policy.make_decision(_state(3), FreeResources({"n": {"CPU": 4, "GPU": 2}}))
    assert grow == ResizeDecision(5, grow.reason)
    assert "3 -> 5" in grow.reason
    at_max = policy.make_decision(_state(6), FreeResources({"n": {"CPU": 64, "GPU": 8}}))
    assert isinstance(at_max, NoopDecision)


def test_min_grow_holds_back_small_growth() -> None:
    policy = ElasticScalingPolicy(min_grow=2)
    one_more = FreeResources({"n": {"CPU": 2, "GPU": 1}})
    assert isinstance(policy.make_decision(_state(3), one_more), NoopDecision)
    two_more = FreeResources({"n": {"CPU": 4, "GPU": 2}})
    assert policy.make_decision(_state(3), two_more).num_workers == 5  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="min_grow=0"):
        ElasticScalingPolicy(min_grow=0)


def test_lost_ranks_shrink_when_no_room_and_are_refilled_when_there_is() -> None:
    policy = ElasticScalingPolicy()
    shrink = policy.make_decision(_state(3, lost_ranks=(2,)), FreeResources())
    assert isinstance(shrink, ResizeDecision)
    assert shrink.num_workers == 2
    assert "rank(s) [2] lost or preempted" in shrink.reason
    refill = policy.make_decision(
        _state(3, lost_ranks=(2,)), FreeResources({"n": {"CPU": 2, "GPU": 1}})
    )
    assert refill.num_workers == 3  # type: ignore[union-attr]
    # below min after the loss: still min (the owner waits for resources)
    floor = policy.make_decision(_state(2, lost_ranks=(0, 1)), FreeResources())
    assert floor.num_workers == 2  # type: ignore[union-attr]


def test_preempted_ranks_do_not_count_and_draining_nodes_are_not_free() -> None:
    policy = ElasticScalingPolicy()
    free = FreeResources({"n0": {"CPU": 2, "GPU": 1}}, draining={"n1": 1_700_000_000_000})
    move = policy.make_decision(_state(3, preempted_ranks=(1, 2)), free)
    assert isinstance(move, ResizeDecision)
    assert move.num_workers == 2
    assert "rank(s) [1, 2] lost or preempted" in move.reason


def test_invalid_group_state_is_named() -> None:
    with pytest.raises(ValueError, match="min_workers=3, max_workers=2"):
        ElasticScalingPolicy().make_decision(GroupState(2, 3, 2), FreeResources())


def test_a_custom_policy_plugs_in() -> None:
    class NeverGrow(ScalingPolicy):
        def make_decision(self, group: GroupState, free: FreeResources) -> ScalingDecision:
            if group.lost_ranks:
                return ResizeDecision(group.usable_workers, "shrink only")
            return NoopDecision("never grow")

    assert NeverGrow().make_decision(_state(3, lost_ranks=(0,)), FreeResources()) == ResizeDecision(
        2, "shrink only"
    )


def test_preemption_info_merges_ranks_and_keeps_the_earliest_deadline() -> None:
    a = PreemptionInfo(2_000, {"n1": [2, 3]})
    b = PreemptionInfo(1_000, {"n1": [3], "n2": [4]})
    merged = merge_preemption_info(a, b)
    assert merged == PreemptionInfo(1_000, {"n1": [2, 3], "n2": [4]})
    assert merged.preempted_ranks == [2, 3, 4]
    assert merged.preempted_node_ids == ["n1", "n2"]
    assert merge_preemption_info(None, a) is a
    assert merge_preemption_info(PreemptionInfo(None, {"x": [0]}), a).deadline_ms == 2_000  # type: ignore[union-attr]
    assert a.seconds_left(now_s=1.5) == pytest.approx(0.5)
    assert PreemptionInfo(None, {}).seconds_left() is None
