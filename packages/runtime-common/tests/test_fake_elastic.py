"""Elastic resize and preemption notices on the in-process fake group (no Ray).

The train controller's unit tests drive the same methods, so these pin the fake's
behaviour to what WorkerGroup does on a real cluster (tests/cluster/).
"""

from __future__ import annotations

import threading
import time

import pytest

from lumos.runtime import (
    ElasticScalingPolicy,
    Event,
    FinishedEvent,
    PreemptionInfo,
    ResizeDecision,
    RuntimeUsageError,
    WorkerGroupSpec,
    WorkerPreemptedEvent,
    worker,
)
from lumos.runtime.testing import FakeCluster, FakeWorkerGroup


def _until(group: FakeWorkerGroup, n_finished: int) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + 30
    while sum(isinstance(e, FinishedEvent) for e in events) < n_finished:
        assert time.monotonic() < deadline, events
        events += group.poll(timeout_s=1.0)
    return events


def world() -> tuple[int, int]:
    session = worker.get_session()
    assert session is not None
    assert session.info is not None
    session.barrier()  # every rank of the current size must arrive
    return session.info.world_rank, session.info.world_size


def test_elastic_start_takes_what_fits() -> None:
    spec = WorkerGroupSpec(num_workers=3, min_workers=2)
    assert len(FakeCluster(fit=2).start(spec).workers) == 2
    assert len(FakeCluster(fit=1).start(spec).workers) == 2  # never below min
    assert len(FakeCluster(fit=5).start(spec).workers) == 3
    assert len(FakeCluster().start(spec).workers) == 3


def test_shrink_renumbers_and_the_next_launch_runs_at_the_new_size() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=3, min_workers=1), num_nodes=3)
    group.launch(world)
    _until(group, 3)
    result = group.remove_workers([1])
    assert result.old_to_new == {0: 0, 2: 1}
    assert result.removed == [1]
    assert result.world_size == 2
    assert [w.node_id for w in group.workers] == ["fake-node-0", "fake-node-2"]
    group.launch(world)
    results = {e.result for e in _until(group, 2) if isinstance(e, FinishedEvent)}
    assert results == {(0, 2), (1, 2)}


def test_grow_uses_free_capacity_only_up_to_max() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=4, min_workers=2), fit=2)
    assert len(group.workers) == 2
    assert group.free_workers == 0
    assert group.add_workers(2).added == []  # nothing free
    group.free_workers = 5
    assert group.free_resources().workers_that_fit(group.spec.resources_per_worker) == 5
    result = group.add_workers(5)
    assert result.added == [2, 3]
    assert result.world_size == 4
    assert group.free_workers == 3
    group.launch(world)
    results = {e.result for e in _until(group, 4) if isinstance(e, FinishedEvent)}
    assert results == {(r, 4) for r in range(4)}
    assert [r.world_size for r in group.resizes] == [2, 4]


def test_policy_and_group_together_shrink_then_grow() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=3, min_workers=2), num_nodes=3)
    policy = ElasticScalingPolicy()
    group.kill_worker(2)
    decision = policy.make_decision(group.scaling_state(lost_ranks=[2]), group.free_resources())
    assert decision == ResizeDecision(2, decision.reason)
    group.remove_workers([2])
    group.free_workers = 1  # a node came back
    decision = policy.make_decision(group.scaling_state(), group.free_resources())
    assert isinstance(decision, ResizeDecision)
    assert decision.num_workers == 3
    assert group.add_workers(decision.num_workers - len(group.workers)).added == [2]


def test_resize_needs_an_elastic_group_and_valid_ranks() -> None:
    fixed = FakeWorkerGroup(WorkerGroupSpec(num_workers=2))
    with pytest.raises(RuntimeUsageError, match="min_workers"):
        fixed.remove_workers([1])
    with pytest.raises(RuntimeUsageError, match="min_workers"):
        fixed.add_workers(1)
    elastic = FakeWorkerGroup(WorkerGroupSpec(num_workers=2, min_workers=1))
    with pytest.raises(RuntimeUsageError, match=r"ranks=\[0, 1\]"):
        elastic.remove_workers([0, 1])
    with pytest.raises(RuntimeUsageError, match="count=0"):
        elastic.add_workers(0)


def wait_for_notice(seen: threading.Event) -> PreemptionInfo | None:
    session = worker.get_session()
    assert session is not None
    session.emit("started")
    while session.preemption_info() is None:
        session.raise_if_stop_requested()
        time.sleep(0.01)
    seen.set()
    return session.preemption_info()


def test_preemption_notice_is_an_event_and_every_rank_sees_it() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=3, min_workers=2), num_nodes=3)
    seen = threading.Event()
    group.launch(wait_for_notice, args=(seen,))
    group.after_reports(3, lambda g: g.preempt_workers([2], deadline_ms=123_000))
    events = _until(group, 3)
    notices = [e for e in events if isinstance(e, WorkerPreemptedEvent)]
    assert notices == [WorkerPreemptedEvent(2, "fake-node-2", 123_000, "node draining")]
    info = PreemptionInfo(123_000, {"fake-node-2": [2]})
    assert [e.result for e in events if isinstance(e, FinishedEvent)] == [info] * 3
    assert group.preemption_info() == info
    assert group.scaling_state().preempted_ranks == (2,)
    # the preempted rank moves away: the notice is gone for the survivors
    group.remove_workers([2])
    assert group.preemption_info() is None
    assert group.scaling_state().preempted_ranks == ()


def _beat() -> None:
    session = worker.get_session()
    assert session is not None
    while True:
        session.raise_if_stop_requested()
        session.emit("beat")
        time.sleep(0.01)


def test_vacate_and_refill_keep_every_rank_number_while_the_others_run() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=3, min_workers=2), fit=3)
    group.launch(_beat)
    group.kill_worker(1)
    assert group.vacate_workers([1]).removed == [1]
    assert len(group.workers) == 3
    assert group.scaling_state().lost_ranks == (1,)
    with pytest.raises(RuntimeUsageError, match="vacant"):
        group.launch(_beat)
    with pytest.raises(RuntimeUsageError, match="invalid"):
        group.vacate_workers([0, 2])  # no worker would stay
    assert group.refill_workers([1]).added == []  # no room
    group.free_workers = 1
    assert group.refill_workers([1]).added == [1]
    group.launch(_beat, ranks=[1])
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while seen != {0, 1, 2}:
        assert time.monotonic() < deadline, seen
        seen |= {e.rank for e in group.poll(timeout_s=0.5)}
    group.shutdown(1.0)


def test_a_barrier_does_not_wait_for_a_rank_that_left_during_the_launch() -> None:
    from lumos.runtime._internal.relay import CollectiveRelay

    sent: list[tuple[list[int], tuple[str, int]]] = []
    relay = CollectiveRelay(3, lambda ranks, key, value: sent.append((ranks, key)))
    relay.handle(0, ("barrier", 0), None)
    relay.handle(2, ("barrier", 0), None)
    assert sent == []
    relay.excuse([1])  # rank 1 was replaced before it got there
    assert sent == [([0, 2], ("barrier", 0))]
    relay.handle(0, ("barrier", 1), None)
    relay.handle(2, ("barrier", 1), None)  # later barriers of the launch do not wait either
    assert sent[-1] == ([0, 2], ("barrier", 1))
    relay.reset()  # a launch on every rank
    relay.handle(0, ("barrier", 0), None)
    relay.handle(2, ("barrier", 0), None)
    assert len(sent) == 2
