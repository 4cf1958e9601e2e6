"""Elastic WorkerGroup on a simulated 3-node cluster: what a resize costs in the runtime.

Measures, on ``ray.cluster_utils.Cluster`` (head with 0 CPUs + 1-CPU nodes):
node removed -> ``WorkerDiedEvent``; ``remove_workers`` + relaunch -> every rank running
at the smaller size (survivors keep their processes); node added -> ``add_workers`` +
relaunch at the larger size; drain (``GcsClient.drain_node``, as the autoscaler) and
SIGTERM -> ``WorkerPreemptedEvent``. The Train-level comparison with ray.train V2
(69-73 s / 21-34 s on this machine) belongs to lumos.train's benchmark; this prints the
runtime's share of it.

Run: ``RAY_ADDRESS=local RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 .venv/bin/python
benchmarks/runtime_elastic_section.py``
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.core.generated import autoscaler_pb2

from lumos.runtime import (
    Event,
    ReportEvent,
    WorkerDiedEvent,
    WorkerGroup,
    WorkerGroupSpec,
    WorkerPreemptedEvent,
    worker,
)


def running() -> None:
    """Report once every rank of the current size passed a barrier, then wait for stop."""
    session = worker.get_session()
    assert session is not None
    session.barrier()
    session.emit("running")
    session.stop_event.wait()


def _wait(group: WorkerGroup, want: type, n: int) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + 120
    while sum(isinstance(e, want) for e in events) < n:
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {n} {want.__name__}: {events[-3:]}")
        events += group.poll(timeout_s=1.0)
    return events


def _relaunch(group: WorkerGroup) -> float:
    """Stop the running function, launch again; seconds until every rank runs."""
    group.request_stop()
    group.poll(0.5)  # FinishedEvents of the stopped function
    t0 = time.perf_counter()
    group.launch(running)
    _wait(group, ReportEvent, len(group.workers))
    return time.perf_counter() - t0


def one_round(cluster: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    spec = WorkerGroupSpec(num_workers=3, min_workers=2, elastic_start_wait_s=0.5)
    with WorkerGroup.start(spec) as group:
        assert len(group.workers) == 3
        group.launch(running)
        _wait(group, ReportEvent, 3)
        victim = next(n for n in cluster.worker_nodes if n.node_id == group.workers[2].node_id)
        t0 = time.perf_counter()
        cluster.remove_node(victim)
        events = _wait(group, WorkerDiedEvent, 1)
        out["node removed -> WorkerDiedEvent"] = time.perf_counter() - t0
        dead = sorted({e.rank for e in events if isinstance(e, WorkerDiedEvent)})
        t1 = time.perf_counter()
        group.remove_workers(dead)
        out["remove_workers"] = time.perf_counter() - t1
        out["relaunch at 2 (barrier passed)"] = _relaunch(group)
        out["node removed -> running at 2"] = time.perf_counter() - t0
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        t2 = time.perf_counter()
        grown = group.add_workers(1, timeout_s=30)
        assert grown.added == [2], grown
        out["add_workers (cold actor)"] = time.perf_counter() - t2
        out["relaunch at 3 (barrier passed)"] = _relaunch(group)
        out["node added -> running at 3"] = time.perf_counter() - t2
        pid = group.workers[0].pid
        t3 = time.perf_counter()
        os.kill(pid, signal.SIGTERM)
        _wait(group, WorkerPreemptedEvent, 1)
        out["SIGTERM -> WorkerPreemptedEvent"] = time.perf_counter() - t3
        gcs = ray._raylet.GcsClient(address=cluster.address)
        node = group.workers[1].node_id
        t4 = time.perf_counter()
        gcs.drain_node(
            node,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "bench",
            int((time.time() + 60) * 1000),
        )
        _wait(group, WorkerPreemptedEvent, 1)
        out["drain_node -> WorkerPreemptedEvent"] = time.perf_counter() - t4
        drained = next(n for n in cluster.worker_nodes if n.node_id == node)
    cluster.remove_node(drained)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return out


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "3"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        here = os.path.dirname(os.path.abspath(__file__))
        ray.init(
            address=cluster.address,
            job_config=ray.job_config.JobConfig(code_search_path=[here]),
        )
        results = [one_round(cluster) for _ in range(rounds)]
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"elastic WorkerGroup, simulated 3 x 1-CPU nodes, {rounds} round(s), median (min-max) s:")
    for key in results[0]:
        values = [r[key] for r in results]
        print(
            f"  {key:36s} {statistics.median(values):7.3f}  ({min(values):.3f}-{max(values):.3f})"
        )


if __name__ == "__main__":
    main()
