"""WorkerPool on a real local Ray cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

from lumos.runtime import (
    ErrorEvent,
    Event,
    FinishedEvent,
    LumosRuntimeError,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
    WorkerPool,
    worker,
)
from lumos.runtime.testing import alive_placement_groups, assert_no_leaked_actors

pytestmark = pytest.mark.usefixtures("no_leaks")

_LOADS = 0


class CountingObjective:
    """Counts how often it is unpickled in a worker process."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_counting, ())

    def __call__(self, x: int) -> dict[str, Any]:
        session = worker.get_session()
        assert session is not None
        assert session.info is None
        session.emit({"x": x})
        return {
            "x": x,
            "loads": _LOADS,
            "pid": os.getpid(),
            "trial": session.session_info.get("trial"),
        }


def _make_counting() -> CountingObjective:
    global _LOADS
    _LOADS += 1
    return CountingObjective()


def wait_for_stop() -> None:
    session = worker.get_session()
    assert session is not None
    session.receive()


def report_pid_and_wait() -> None:
    session = worker.get_session()
    assert session is not None
    session.emit(os.getpid())
    session.receive()


def echo_twice() -> list[Any]:
    session = worker.get_session()
    assert session is not None
    return [session.receive(timeout_s=60), session.receive(timeout_s=60)]


def _poll_until(
    pool: WorkerPool, done: Callable[[list[Event]], bool], timeout_s: float = 120
) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, f"timed out; got {events[-5:]}"
        events += pool.poll(2.0)
    return events


def _ended(n: int) -> Callable[[list[Event]], bool]:
    return lambda evs: sum(isinstance(e, (FinishedEvent, ErrorEvent)) for e in evs) >= n


def test_pool_reuses_actors_and_ships_fn_once() -> None:
    objective = CountingObjective()
    with WorkerPool({"CPU": 1}) as pool:
        a, b = pool.add_worker(), pool.add_worker()
        results: list[dict[str, Any]] = []
        for round_ in range(3):
            for wid in (a, b):
                pool.launch(
                    wid, objective, kwargs={"x": round_}, session_info={"trial": f"t{round_}-{wid}"}
                )
            events = _poll_until(pool, _ended(2))
            assert sorted(e.rank for e in events if isinstance(e, ReportEvent)) == [a, b]
            results += [e.result for e in events if isinstance(e, FinishedEvent)]
        assert pool.ready(a)
        assert pool.ready(b)
        assert pool.pending_workers() == []
    assert len({r["pid"] for r in results}) == 2  # two actors, reused
    assert {r["loads"] for r in results} == {1}  # deserialized once per actor
    assert sorted(r["trial"] for r in results)[0] == "t0-0"


def test_pool_pending_when_no_resources_then_ready_after_removal() -> None:
    with WorkerPool({"CPU": 3}) as pool:
        # 4 CPUs in the cluster: one of the two is placed, the other waits (which one is
        # Ray's choice: it does not promise to place actors in the order asked).
        first, second = pool.add_worker(), pool.add_worker()
        deadline = time.monotonic() + 60
        while not (pool.ready(first) or pool.ready(second)):
            assert time.monotonic() < deadline
            pool.poll(1.0)
        placed, waiting = (first, second) if pool.ready(first) else (second, first)
        assert pool.pending_workers() == [waiting]
        assert not pool.ready(waiting)
        pool.remove_worker(placed)
        while not pool.ready(waiting):
            assert time.monotonic() < deadline + 60
            pool.poll(1.0)
        assert pool.pending_workers() == []
        with pytest.raises(LumosRuntimeError, match="unknown worker id"):
            pool.launch(placed, wait_for_stop)


def test_pool_send_and_stop() -> None:
    with WorkerPool({"CPU": 1}) as pool:
        a, b = pool.add_worker(), pool.add_worker()
        pool.launch(a, wait_for_stop)
        pool.launch(b, echo_twice)
        pool.send(b, "x")
        pool.send(b, "y")
        events = _poll_until(pool, _ended(1))
        assert [e.result for e in events if isinstance(e, FinishedEvent)] == [["x", "y"]]
        pool.request_stop(a)
        events = _poll_until(pool, _ended(1))
        assert [(e.rank, e.stopped) for e in events if isinstance(e, FinishedEvent)] == [(a, True)]


def test_pool_sigkilled_worker_is_reported_died() -> None:
    import signal

    with WorkerPool({"CPU": 1}) as pool:
        a, b = pool.add_worker(), pool.add_worker()
        pool.launch(a, report_pid_and_wait)
        pool.launch(b, report_pid_and_wait)
        events = _poll_until(pool, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)
        pids = {e.rank: e.payload for e in events if isinstance(e, ReportEvent)}
        os.kill(pids[b], signal.SIGKILL)
        events = _poll_until(pool, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs), 60)
        assert [e.rank for e in events if isinstance(e, WorkerDiedEvent)] == [b]
        assert pool.node_id(b) is not None
        pool.remove_worker(b)
        pool.request_stop(a)
        events = _poll_until(pool, _ended(1))
        assert [(e.rank, e.stopped) for e in events if isinstance(e, FinishedEvent)] == [(a, True)]


def test_pool_zero_resource_workers() -> None:
    with WorkerPool({"CPU": 0}) as pool:
        ids = [pool.add_worker() for _ in range(6)]  # more than the 4 CPUs: none are reserved
        for wid in ids:
            pool.launch(wid, echo_twice)
            pool.send(wid, wid)
            pool.send(wid, "z")
        events = _poll_until(pool, _ended(6))
        assert sorted(e.result[0] for e in events if isinstance(e, FinishedEvent)) == ids


def start_group_then(action: str) -> None:
    """Start a nested WorkerGroup, report its placement group name, then die or wait."""
    from lumos.runtime import WorkerGroup, WorkerGroupSpec

    session = worker.get_session()
    assert session is not None
    group = WorkerGroup.start(WorkerGroupSpec(num_workers=1))
    pg = group.placement_group
    assert pg is not None
    name = ray.util.placement_group_table(pg)["name"]
    actor_id = ray.get_runtime_context().get_actor_id()
    session.emit({"pg_name": name, "actor_id": actor_id})
    session.receive()  # the test says when
    if action == "exit":
        os._exit(1)  # no cleanup: the nested group's placement group would stay (Ray keeps it)
    session.receive()  # "wait": until the worker is removed


def _nested_group_started(pool: WorkerPool, wid: int) -> dict[str, Any]:
    events = _poll_until(pool, lambda evs: any(isinstance(e, ReportEvent) for e in evs))
    payload: dict[str, Any] = next(e.payload for e in events if isinstance(e, ReportEvent))
    assert payload["pg_name"].startswith(f"lumos-wg-{payload['actor_id']}-")
    assert [p.name for p in alive_placement_groups()] == [payload["pg_name"]]
    return payload


def test_worker_that_dies_with_a_nested_group_leaves_no_placement_group() -> None:
    with WorkerPool({"CPU": 1}) as pool:
        wid = pool.add_worker()
        pool.launch(wid, start_group_then, args=("exit",))
        _nested_group_started(pool, wid)
        pool.send(wid, "go")
        events = _poll_until(pool, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs))
        assert [e.rank for e in events if isinstance(e, WorkerDiedEvent)] == [wid]
        # The pool removed the placement group when it saw the death (not at shutdown).
        assert_no_leaked_actors(timeout_s=30.0)
        pool.remove_worker(wid)


def test_removed_worker_with_a_nested_group_leaves_no_placement_group() -> None:
    with WorkerPool({"CPU": 1}) as pool:
        wid = pool.add_worker()
        pool.launch(wid, start_group_then, args=("wait",))
        _nested_group_started(pool, wid)
        pool.send(wid, "go")
        pool.remove_worker(wid)  # e.g. Tune killing a hung trial actor
        assert_no_leaked_actors(timeout_s=30.0)


def test_driver_group_placement_group_is_named_after_driver() -> None:
    from lumos.runtime import WorkerGroup, WorkerGroupSpec

    with WorkerGroup.start(WorkerGroupSpec(num_workers=1)) as group:
        assert group.placement_group is not None
        name = ray.util.placement_group_table(group.placement_group)["name"]
        assert name.startswith("lumos-wg-driver-")


def emit_steps(n: int) -> int:
    session = worker.get_session()
    assert session is not None
    for step in range(n):
        session.emit(step)
    return os.getpid()


def test_short_runs_back_to_back_keep_their_events_in_order() -> None:
    # After its first run a worker has the function and sits idle with no poll call
    # outstanding, so each later launch brings its events back in its own reply.
    with WorkerPool({"CPU": 1}) as pool:
        wid = pool.add_worker()
        for run in range(20):
            steps = run % 4
            pool.launch(wid, emit_steps, args=(steps,))
            events = _poll_until(pool, _ended(1))
            assert [e.payload for e in events if isinstance(e, ReportEvent)] == list(range(steps))
            assert isinstance(events[-1], FinishedEvent), events
        # A long run launched the same way still takes messages and a stop.
        pool.launch(wid, echo_twice)
        pool.send(wid, "a")
        pool.send(wid, "b")
        events = _poll_until(pool, _ended(1))
        assert [e.result for e in events if isinstance(e, FinishedEvent)] == [["a", "b"]]
        pool.launch(wid, wait_for_stop)
        # Issue the plain poll call (the launch unparked the worker); it stays outstanding
        # while the stop arrives.
        assert pool.poll(0.0) == []
        pool.request_stop(wid)
        events = _poll_until(pool, _ended(1))
        assert [(e.rank, e.stopped) for e in events if isinstance(e, FinishedEvent)] == [
            (wid, True)
        ]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_idle_worker_that_dies_or_hangs_is_noticed(sig: str) -> None:
    import signal

    with WorkerPool({"CPU": 1}, health_check_timeout_s=1.0) as pool:
        wid = pool.add_worker()
        pool.launch(wid, emit_steps, args=(1,))
        events = _poll_until(pool, _ended(1))
        pid = next(e.result for e in events if isinstance(e, FinishedEvent))
        os.kill(pid, getattr(signal, sig))  # the worker is idle: no function runs
        try:
            events = _poll_until(
                pool,
                lambda evs: any(isinstance(e, (WorkerDiedEvent, WorkerHungEvent)) for e in evs),
                30,
            )
            kind = WorkerDiedEvent if sig == "SIGKILL" else WorkerHungEvent
            assert [(type(e), e.rank) for e in events] == [(kind, wid)]
        finally:
            if sig == "SIGSTOP":
                os.kill(pid, signal.SIGCONT)
        pool.remove_worker(wid)
