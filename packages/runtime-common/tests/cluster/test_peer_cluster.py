"""An elastic WorkerGroup whose ranks go on while others leave, join and move
(``vacate_workers`` / ``refill_workers``), on the simulated cluster of this folder.

The test brings its own nodes (a ``peer`` resource only they have) and removes them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray
from group_waits import assert_released, poll_until

from lumos.runtime import (
    Event,
    ReportEvent,
    RuntimeUsageError,
    WorkerDiedEvent,
    WorkerGroup,
    WorkerGroupSpec,
    worker,
)
from lumos.runtime.testing import wait_until_process_gone

SPEC = WorkerGroupSpec(
    num_workers=2,
    min_workers=1,
    resources_per_worker={"CPU": 1, "peer": 1},
    placement_timeout_s=60.0,
    elastic_start_wait_s=5.0,
)


def heartbeat() -> None:
    """Report ``(world rank, pid)`` every 0.1 s until stopped."""
    session = worker.get_session()
    assert session is not None
    assert session.info is not None
    while True:
        session.raise_if_stop_requested()
        session.emit((session.info.world_rank, os.getpid()))
        time.sleep(0.1)


def _beats(events: list[Event], rank: int) -> set[int]:
    """The pids that reported as ``rank``."""
    return {e.payload[1] for e in events if isinstance(e, ReportEvent) and e.rank == rank}


def _beating(rank: int, n: int = 3) -> Callable[[list[Event]], bool]:
    return lambda evs: sum(isinstance(e, ReportEvent) and e.rank == rank for e in evs) >= n


def test_vacated_ranks_keep_their_numbers_and_refill_or_move_while_the_others_run(
    cluster: Any,
) -> None:
    nodes = [_add_node(cluster) for _ in range(2)]
    try:
        with WorkerGroup.start(SPEC) as group:
            assert len(group.workers) == 2
            group.launch(heartbeat)
            poll_until(group, lambda evs: _beating(0)(evs) and _beating(1)(evs))
            survivor = group.workers[1].pid

            # rank 0's node goes, and no room is left: rank 0 is vacated, rank 1 goes on
            victim = next(n for n in nodes if n.node_id == group.workers[0].node_id)
            cluster.remove_node(victim)
            poll_until(group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs))
            vacated = group.vacate_workers([0])
            assert vacated.removed == [0]
            assert len(group.workers) == 2  # nothing re-numbered
            assert group.scaling_state().lost_ranks == (0,)
            with pytest.raises(RuntimeUsageError, match="vacant"):
                group.launch(heartbeat)
            assert group.refill_workers([0], timeout_s=0.5).added == []  # no room yet
            events = poll_until(group, _beating(1))
            assert _beats(events, 1) == {survivor}

            # room comes back: a new worker takes rank 0 and runs alone; rank 1 goes on
            fresh = _add_node(cluster)
            nodes.append(fresh)
            assert group.refill_workers([0], timeout_s=30.0).added == [0]
            assert group.workers[0].node_id == fresh.node_id
            assert group.scaling_state().lost_ranks == ()
            group.launch(heartbeat, ranks=[0])
            events = poll_until(group, lambda evs: _beating(0)(evs) and _beating(1)(evs))
            assert _beats(events, 1) == {survivor}
            assert survivor not in _beats(events, 0)

            # rank 1 moves (a preemption notice): its new worker starts elsewhere first,
            # then its old one ends; no death is reported, rank 0 goes on
            moved_to = _add_node(cluster)
            nodes.append(moved_to)
            rank0 = group.workers[0].pid
            assert group.refill_workers([1], timeout_s=30.0).added == [1]
            assert group.workers[1].node_id == moved_to.node_id
            wait_until_process_gone(survivor)
            group.launch(heartbeat, ranks=[1])
            events = poll_until(group, lambda evs: _beating(0)(evs) and _beating(1)(evs))
            assert not any(isinstance(e, WorkerDiedEvent) for e in events)
            assert _beats(events, 0) == {rank0}
            assert survivor not in _beats(events, 1)
    finally:
        for node in nodes:
            if any(n.node_id == node.node_id for n in cluster.worker_nodes):
                cluster.remove_node(node)
    assert_released()


def _add_node(cluster: Any) -> Any:
    """A 1-CPU node with the ``peer`` resource, once alive (``Cluster.wait_for_nodes``
    would also wait for the nodes earlier tests removed)."""
    node = cluster.add_node(num_cpus=1, resources={"peer": 1})
    deadline = time.monotonic() + 60.0
    while not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} did not join in 60 s"
        time.sleep(0.2)
    return node
