"""Elastic resize and preemption notices of a real WorkerGroup on a simulated 3-node cluster.

One cluster for the module (see conftest): the tests run in order and each leaves the
nodes as the next one expects.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import ray
from group_waits import assert_released, poll_until
from ray.core.generated import autoscaler_pb2

from lumos.runtime import (
    ElasticScalingPolicy,
    Event,
    FinishedEvent,
    NoopDecision,
    ReportEvent,
    ResizeDecision,
    WorkerDiedEvent,
    WorkerGroup,
    WorkerGroupSpec,
    WorkerPreemptedEvent,
    worker,
)

SPEC = WorkerGroupSpec(
    num_workers=3, min_workers=2, placement_timeout_s=60.0, elastic_start_wait_s=1.0
)


def where() -> tuple[int, int, int]:
    """(world rank, world size, pid), after a barrier over the current size."""
    session = worker.get_session()
    assert session is not None
    assert session.info is not None
    session.barrier()
    return session.info.world_rank, session.info.world_size, os.getpid()


def wait_for_notice() -> Any:
    """Report, then wait until a preemption notice arrives; return it."""
    session = worker.get_session()
    assert session is not None
    session.emit("running")
    while session.preemption_info() is None:
        session.raise_if_stop_requested()
        time.sleep(0.02)
    return session.preemption_info()


def _run(group: WorkerGroup) -> dict[int, tuple[int, int, int]]:
    group.launch(where)
    n = len(group.workers)
    events = poll_until(group, lambda evs: sum(isinstance(e, FinishedEvent) for e in evs) >= n)
    return {e.rank: e.result for e in events if isinstance(e, FinishedEvent)}


def test_starts_with_min_grows_on_a_new_node_and_shrinks_on_a_lost_one(cluster: Any) -> None:
    policy = ElasticScalingPolicy()
    with WorkerGroup.start(SPEC) as group:
        # two 1-CPU nodes: 2 of at most 3 workers started, nothing more fits
        assert len(group.workers) == 2
        assert len({w.node_id for w in group.workers}) == 2
        assert group.add_workers(1, timeout_s=0.5).added == []
        keep = policy.make_decision(group.scaling_state(), group.free_resources())
        assert isinstance(keep, NoopDecision)

        new_node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        decision = policy.make_decision(group.scaling_state(), group.free_resources())
        assert isinstance(decision, ResizeDecision)
        assert decision.num_workers == 3
        before = _run(group)
        grown = group.add_workers(decision.num_workers - len(group.workers), timeout_s=30.0)
        assert grown.added == [2]
        assert grown.old_to_new == {0: 0, 1: 1}
        after = _run(group)
        assert {r: v[:2] for r, v in after.items()} == {r: (r, 3) for r in range(3)}
        assert [after[r][2] for r in (0, 1)] == [before[r][2] for r in (0, 1)]  # same processes
        assert group.workers[2].node_id == new_node.node_id

        # lose the node of rank 1: it dies, the others keep their processes
        victim = next(n for n in cluster.worker_nodes if n.node_id == group.workers[1].node_id)
        pids = {w.world_rank: w.pid for w in group.workers}
        cluster.remove_node(victim)
        events = poll_until(group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs))
        dead = sorted({e.rank for e in events if isinstance(e, WorkerDiedEvent)})
        assert dead == [1]
        decision = policy.make_decision(
            group.scaling_state(lost_ranks=dead), group.free_resources()
        )
        assert isinstance(decision, ResizeDecision)
        assert decision.num_workers == 2  # no room for a replacement: shrink
        shrunk = group.remove_workers(dead)
        assert shrunk.old_to_new == {0: 0, 2: 1}
        final = _run(group)
        assert {r: v[:2] for r, v in final.items()} == {0: (0, 2), 1: (1, 2)}
        assert [final[0][2], final[1][2]] == [pids[0], pids[2]]
    assert_released()


def test_sigterm_and_a_node_drain_are_preemption_notices(cluster: Any) -> None:
    spec = WorkerGroupSpec(num_workers=2, min_workers=1, placement_timeout_s=60.0)
    with WorkerGroup.start(spec) as group:
        assert len(group.workers) == 2
        group.launch(wait_for_notice)
        poll_until(group, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)

        # SIGTERM to rank 0's process: a notice (with the default 30 s deadline), no death
        rank0 = group.workers[0]
        t0 = time.time()
        os.kill(rank0.pid, signal.SIGTERM)
        events = poll_until(group, _finished(2))
        notices = [e for e in events if isinstance(e, WorkerPreemptedEvent)]
        assert [(e.rank, e.node_id, e.reason) for e in notices] == [(0, rank0.node_id, "SIGTERM")]
        assert notices[0].deadline_ms is not None
        assert 25 < notices[0].deadline_ms / 1000 - t0 < 35
        results = [e.result for e in events if isinstance(e, FinishedEvent)]
        assert [r.preempted_node_to_ranks for r in results] == [{rank0.node_id: [0]}] * 2
        assert not any(isinstance(e, WorkerDiedEvent) for e in events)
        assert ray.get(group.actors[0].ping.remote()) == rank0.pid  # still alive

        # drain rank 1's node the way the autoscaler does (preemption, 20 s deadline)
        rank1 = group.workers[1]
        deadline_ms = int((time.time() + 20) * 1000)
        gcs = ray._raylet.GcsClient(address=cluster.address)  # type: ignore[attr-defined]
        accepted, why = gcs.drain_node(
            rank1.node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),  # type: ignore[attr-defined]
            "spot instance reclaimed",
            deadline_ms,
        )
        assert accepted, why
        events = poll_until(
            group, lambda evs: any(isinstance(e, WorkerPreemptedEvent) for e in evs)
        )
        drained = [e for e in events if isinstance(e, WorkerPreemptedEvent)]
        assert drained == [WorkerPreemptedEvent(1, rank1.node_id, deadline_ms, "node draining")]
        info = group.preemption_info()
        assert info is not None
        assert info.preempted_node_to_ranks == {rank0.node_id: [0], rank1.node_id: [1]}
        assert info.deadline_ms == deadline_ms  # the earlier of the two
        assert group.scaling_state().preempted_ranks == (0, 1)
        assert rank1.node_id in group.free_resources().draining
    assert_released()


def _finished(n: int) -> Callable[[list[Event]], bool]:
    return lambda evs: sum(isinstance(e, FinishedEvent) for e in evs) >= n
