"""Event handling against the in-process FakeWorkerGroup (same interface as WorkerGroup)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lumos.runtime import (
    ErrorEvent,
    Event,
    FinishedEvent,
    ReportEvent,
    StopRequested,
    WorkerDiedEvent,
    WorkerGroupError,
    WorkerGroupSpec,
    WorkerGroupStartError,
    WorkerHungEvent,
    worker,
)
from lumos.runtime.testing import FakeCluster, FakeWorkerGroup


def _drain_until(group: Any, done: Any, timeout_s: float = 30.0) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, f"timed out; got {events}"
        events += group.poll(1.0)
    return events


def _finished(n: int) -> Any:
    return lambda evs: (
        sum(isinstance(e, (FinishedEvent, ErrorEvent, WorkerDiedEvent)) for e in evs) >= n
    )


def test_reports_arrive_in_order_none_lost() -> None:
    def fn(n: int) -> str:
        s = worker.get_session()
        assert s is not None
        for i in range(n):
            s.emit(i)
        return f"rank{s.info.world_rank}"  # type: ignore[union-attr]

    with FakeWorkerGroup.start(WorkerGroupSpec(num_workers=3)) as group:
        group.launch(fn, kwargs={"n": 2000})
        events = _drain_until(group, _finished(3))
    for rank in range(3):
        reports = [e for e in events if isinstance(e, ReportEvent) and e.rank == rank]
        assert [e.seq for e in reports] == list(range(2000))
        assert [e.payload for e in reports] == list(range(2000))
    results = sorted(e.result for e in events if isinstance(e, FinishedEvent))
    assert results == ["rank0", "rank1", "rank2"]


def test_per_rank_kwargs_session_info_barrier_broadcast_send() -> None:
    def fn(tag: str, rank_value: int) -> tuple[Any, ...]:
        s = worker.get_session()
        assert s is not None
        s.barrier()
        v = s.broadcast_from_rank_zero(rank_value)
        got = s.receive(timeout_s=30)
        s.barrier()
        return (tag, rank_value, v, got, s.session_info["run"])

    with FakeWorkerGroup(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(
            fn,
            kwargs={"tag": "t"},
            per_rank_kwargs=[{"rank_value": 10}, {"rank_value": 11}],
            session_info={"run": "r1"},
        )
        group.send("hello")
        events = _drain_until(group, _finished(2))
    results = sorted(e.result for e in events if isinstance(e, FinishedEvent))
    assert results == [("t", 10, 10, "hello", "r1"), ("t", 11, 10, "hello", "r1")]
    assert group.sent == [("hello", [0, 1])]


def test_error_on_every_rank_keeps_each_traceback() -> None:
    def failing() -> None:
        s = worker.get_session()
        raise ValueError(f"bad on {s.info.world_rank}")  # type: ignore[union-attr]

    with FakeWorkerGroup(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(failing)
        events = _drain_until(group, _finished(2))
    errors = {e.rank: e.error for e in events if isinstance(e, ErrorEvent)}
    assert set(errors) == {0, 1}
    for rank, err in errors.items():
        assert err.exc_type == "builtins.ValueError"
        assert err.message == f"bad on {rank}"
        assert "in failing" in err.traceback


def test_stop_request_finishes_stopped() -> None:
    def waits_forever() -> None:
        s = worker.get_session()
        assert s is not None
        s.receive()

    with FakeWorkerGroup(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(waits_forever)
        group.request_stop()
        events = _drain_until(group, _finished(2))
    assert all(isinstance(e, FinishedEvent) and e.stopped for e in events)


def test_scripted_kill_after_reports_drops_dead_rank_events() -> None:
    release = threading.Event()

    def fn() -> None:
        s = worker.get_session()
        assert s is not None
        for i in range(5):
            s.emit(i)
        release.wait(30)
        s.raise_if_stop_requested()
        s.emit("after")

    cluster = FakeCluster([lambda g: g.after_reports(3, lambda g: g.kill_worker(1, "SIGKILL"))])
    group = cluster.start(WorkerGroupSpec(num_workers=2))
    group.launch(fn)
    events = _drain_until(group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs))
    died = [e for e in events if isinstance(e, WorkerDiedEvent)]
    assert died == [WorkerDiedEvent(1, "fake-node-0", "SIGKILL")]
    release.set()
    events += _drain_until(group, lambda evs: any(isinstance(e, FinishedEvent) for e in evs))
    assert not any(
        isinstance(e, ReportEvent) and e.rank == 1 and e.payload == "after" for e in events
    )
    assert any(isinstance(e, ReportEvent) and e.rank == 0 and e.payload == "after" for e in events)
    group.replace_workers([1])
    assert group.replaced == [[1]]
    group.shutdown()
    group.shutdown()
    assert group.shutdown_calls == 2
    assert group.leaked_threads == []
    assert cluster.groups == [group]


def test_cluster_start_failure_then_success_and_injected_events() -> None:
    cluster = FakeCluster([WorkerGroupStartError("no resources"), lambda g: g.hang_worker(0, 3.0)])
    spec = WorkerGroupSpec(num_workers=2)
    with pytest.raises(WorkerGroupStartError, match="no resources"):
        cluster.start(spec)
    group = cluster.start(spec)
    assert group.poll(0.0) == [WorkerHungEvent(0, "fake-node-0", 3.0)]
    group.fail_worker(1, RuntimeError("oom"))
    (ev,) = group.poll(0.0)
    assert isinstance(ev, ErrorEvent)
    assert ev.error.message == "oom"
    assert ev.rank == 1
    assert group.poll(0.0) == []
    assert len(cluster.specs) == 2
    assert len(cluster.groups) == 1
    group.shutdown()


def test_execute_and_errors() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=2), num_nodes=2)
    assert [w.node_rank for w in group.workers] == [0, 1]
    assert [w.local_rank for w in group.workers] == [0, 0]
    assert group.execute(lambda x: x * 2, 4) == [8, 8]
    assert group.execute_single(1, lambda: "one") == "one"
    with pytest.raises(WorkerGroupError) as info:
        group.execute(lambda: 1 / 0)
    assert set(info.value.errors) == {0, 1}
    group.shutdown()
    with pytest.raises(WorkerGroupError, match="shut down"):
        group.launch(lambda: None)


def test_poll_without_running_threads_returns_when_nothing_can_arrive() -> None:
    group = FakeWorkerGroup(WorkerGroupSpec(num_workers=1))
    assert group.poll(None) == []
    group.shutdown()


def test_stop_requested_raised_by_user_is_not_an_error() -> None:
    def fn() -> None:
        raise StopRequested("done early")

    with FakeWorkerGroup(WorkerGroupSpec(num_workers=1)) as group:
        group.launch(fn)
        events = _drain_until(group, _finished(1))
    assert events == [FinishedEvent(0, None, True)]


def test_launch_while_previous_function_runs_is_an_error_event() -> None:
    def waits() -> None:
        s = worker.get_session()
        assert s is not None
        s.receive()

    with FakeWorkerGroup(WorkerGroupSpec(num_workers=1)) as group:
        group.launch(waits)
        group.launch(waits)
        (ev,) = group.poll(5.0)
        assert isinstance(ev, ErrorEvent)
        assert "still running" in ev.error.message
        group.request_stop()
        assert _drain_until(group, _finished(1)) == [FinishedEvent(0, None, True)]
