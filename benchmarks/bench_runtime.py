"""Benchmark lumos.runtime against bare Ray in the same run.

1. Group start, 2 workers: ``WorkerGroup.start`` vs bare Ray doing the same (placement
   group + 2 actors + one call each). Target: ratio <= 1.2.
2. Event round trip: ``session.emit`` in the worker -> the event returned by
   ``WorkerGroup.poll`` in the owner. Target: median < 5 ms.
3. ``emit`` cost in the user thread and 10,000-report throughput (for reference).

Run: ``python benchmarks/bench_runtime.py [--reps N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lumos.runtime import FinishedEvent, ReportEvent, WorkerGroup, WorkerGroupSpec, worker


@ray.remote
class BareActor:
    def meta(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(), "gpus": ray.get_gpu_ids()}


def bare_start(n: int) -> tuple[float, Any, list[Any]]:
    t0 = time.perf_counter()
    pg = placement_group([{"CPU": 1}] * n, strategy="PACK")
    ray.get(pg.ready())
    actors = [
        BareActor.options(
            num_cpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(n)
    ]
    ray.get([a.meta.remote() for a in actors])
    return time.perf_counter() - t0, pg, actors


def bare_stop(pg: Any, actors: list[Any]) -> None:
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)


def lumos_start(n: int) -> tuple[float, WorkerGroup]:
    t0 = time.perf_counter()
    group = WorkerGroup.start(WorkerGroupSpec(num_workers=n))
    return time.perf_counter() - t0, group


def _settle() -> None:
    """Wait until the previous run's resources are free again (kills are asynchronous)."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)


def ping_pong(rounds: int) -> list[float]:
    session = worker.get_session()
    assert session is not None
    for _ in range(rounds):
        session.emit(time.time())
        session.receive(timeout_s=60)
    return []


def emit_cost(n: int) -> dict[str, float]:
    session = worker.get_session()
    assert session is not None
    costs = []
    for i in range(n):
        t0 = time.perf_counter()
        session.emit({"i": i, "loss": 0.5})
        costs.append(time.perf_counter() - t0)
    costs.sort()
    return {
        "median_us": costs[len(costs) // 2] * 1e6,
        "p99_us": costs[int(len(costs) * 0.99)] * 1e6,
    }


def bench_start(reps: int) -> None:
    # Warm up both paths (class export, worker pool) once, untimed.
    _, pg, actors = bare_start(2)
    bare_stop(pg, actors)
    _settle()
    _, g = lumos_start(2)
    g.shutdown(grace_period_s=0)
    _settle()
    bare: list[float] = []
    ours: list[float] = []
    for i in range(reps):
        order = ("bare", "lumos") if i % 2 == 0 else ("lumos", "bare")
        for which in order:
            if which == "bare":
                t, pg, actors = bare_start(2)
                bare.append(t)
                bare_stop(pg, actors)
            else:
                t, g = lumos_start(2)
                ours.append(t)
                g.shutdown(grace_period_s=0)
            _settle()
    mb, ml = statistics.median(bare), statistics.median(ours)
    print(f"group start, 2 workers, {reps} reps (median):")
    print(f"  bare Ray (PG + 2 actors + 1 call each): {mb * 1000:8.1f} ms")
    print(f"  lumos WorkerGroup.start:                {ml * 1000:8.1f} ms")
    print(f"  ratio lumos / bare: {ml / mb:.2f}x  (target <= 1.2x)")


def bench_events(rounds: int) -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=1)) as group:
        group.launch(ping_pong, kwargs={"rounds": rounds})
        lat: list[float] = []
        done = False
        deadline = time.monotonic() + 300
        while not done and time.monotonic() < deadline:
            for ev in group.poll(timeout_s=10):
                if isinstance(ev, ReportEvent):
                    lat.append(time.time() - ev.payload)
                    group.send("ack")
                elif isinstance(ev, FinishedEvent):
                    done = True
                else:
                    raise RuntimeError(f"unexpected event {ev}")
        lat = sorted(lat[5:])  # drop warm-up rounds
        med, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
        print(f"event round trip emit -> poll ({len(lat)} rounds):")
        print(f"  median {med * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms  (target median < 5 ms)")

        # bare Ray reference: one actor method call round trip
        a = BareActor.remote()
        ray.get(a.meta.remote())
        calls = []
        for _ in range(200):
            t0 = time.perf_counter()
            ray.get(a.meta.remote())
            calls.append(time.perf_counter() - t0)
        ray.kill(a)
        calls.sort()
        print(f"  (bare Ray actor call round trip: median {calls[len(calls) // 2] * 1000:.2f} ms)")

        n = 10_000
        group.launch(emit_cost, kwargs={"n": n})
        t0 = time.perf_counter()
        got = 0
        result: dict[str, float] = {}
        while not result and time.monotonic() < deadline:
            for ev in group.poll(timeout_s=10):
                if isinstance(ev, ReportEvent):
                    got += 1
                elif isinstance(ev, FinishedEvent):
                    result = ev.result
        elapsed = time.perf_counter() - t0
        print(
            f"emit() in the user thread: median {result['median_us']:.1f} us, p99 {result['p99_us']:.1f} us; "
            f"{got} reports delivered in {elapsed * 1000:.0f} ms ({got / elapsed:,.0f}/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        bench_start(args.reps)
        bench_events(args.rounds)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
