"""WorkerGroup on a real local Ray cluster (one per session, see conftest)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from lumos.runtime import (
    ErrorEvent,
    Event,
    FinishedEvent,
    ReportEvent,
    WorkerDiedEvent,
    WorkerGroup,
    WorkerGroupError,
    WorkerGroupSpec,
    WorkerGroupStartError,
    WorkerHungEvent,
    worker,
)
from lumos.runtime.testing import (
    alive_actors,
    alive_placement_groups,
    process_running,
    wait_until_process_gone,
)

pytestmark = pytest.mark.usefixtures("no_leaks")


def _poll_until(
    group: WorkerGroup, done: Callable[[list[Event]], bool], timeout_s: float = 120.0
) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, f"timed out; got {events[-5:]}"
        events += group.poll(timeout_s=2.0)
    return events


def _ended(n: int) -> Callable[[list[Event]], bool]:
    return lambda evs: (
        sum(isinstance(e, (FinishedEvent, ErrorEvent, WorkerDiedEvent)) for e in evs) >= n
    )


# -- user functions (module level: pickled by reference) ---------------------------------
def _getenv(name: str) -> str | None:
    return os.environ.get(name)


def emit_many(n: int) -> int:
    session = worker.get_session()
    assert session is not None
    for i in range(n):
        session.emit({"i": i})
    return n


def fail_on_every_rank() -> None:
    session = worker.get_session()
    assert session is not None
    _fail_deep(session.info.world_rank)  # type: ignore[union-attr]


def _fail_deep(rank: int) -> None:
    raise ValueError(f"loss is nan on rank {rank}")


def wait_for_stop() -> None:
    session = worker.get_session()
    assert session is not None
    session.emit("started")
    session.receive()  # raises StopRequested


def collectives(base: int) -> tuple[Any, ...]:
    session = worker.get_session()
    assert session is not None
    info = session.info
    assert info is not None
    session.barrier()
    v = session.broadcast_from_rank_zero(base + info.world_rank)
    msgs = [session.receive(timeout_s=60), session.receive(timeout_s=60)]
    session.barrier()
    return (info.world_rank, v, msgs, os.environ.get("LUMOS_TEST_ENV"), session.session_info)


def ignore_stop() -> None:
    session = worker.get_session()
    assert session is not None
    session.emit("started")
    time.sleep(3600)  # a user function that never checks for a stop


def test_start_metadata_and_ranks() -> None:
    spec = WorkerGroupSpec(num_workers=2, env_vars={"LUMOS_TEST_ENV": "yes"})
    with WorkerGroup.start(spec) as group:
        infos = group.workers
        assert [w.world_rank for w in infos] == [0, 1]
        assert {w.world_size for w in infos} == {2}
        node = ray.get_runtime_context().get_node_id()
        assert all(w.node_id == node and w.node_rank == 0 for w in infos)
        assert [w.local_rank for w in infos] == [0, 1]
        assert {w.local_world_size for w in infos} == {2}
        pids = group.execute(os.getpid)
        assert pids == [w.pid for w in infos]
        assert len(set(pids)) == 2
        assert group.execute(_getenv, "LUMOS_TEST_ENV") == ["yes", "yes"]
        assert group.execute_single(1, os.getpid) == infos[1].pid
        refs = group.execute_async(os.getpid)
        assert ray.get(refs) == pids
        assert len(alive_actors()) == 2
        assert len(alive_placement_groups()) == 1


def test_ten_thousand_reports_in_order_none_lost() -> None:
    n = 10_000
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(emit_many, kwargs={"n": n})
        events = _poll_until(group, _ended(2))
    assert [e for e in events if isinstance(e, (ErrorEvent, WorkerDiedEvent))] == []
    for rank in (0, 1):
        reports = [e for e in events if isinstance(e, ReportEvent) and e.rank == rank]
        assert [e.seq for e in reports] == list(range(n))
        assert [e.payload["i"] for e in reports] == list(range(n))
    assert sorted(e.result for e in events if isinstance(e, FinishedEvent)) == [n, n]


def test_user_exception_on_both_ranks_surfaces_both_tracebacks() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(fail_on_every_rank)
        events = _poll_until(group, _ended(2))
    errors = {e.rank: e.error for e in events if isinstance(e, ErrorEvent)}
    assert set(errors) == {0, 1}
    for rank, err in errors.items():
        assert err.rank == rank
        assert err.exc_type == "builtins.ValueError"
        assert err.message == f"loss is nan on rank {rank}"
        assert "fail_on_every_rank" in err.traceback
        assert "_fail_deep" in err.traceback
        assert isinstance(err.cause, ValueError)
        assert f"rank {rank}" in str(err)


def test_barrier_broadcast_send_env_and_session_info() -> None:
    spec = WorkerGroupSpec(num_workers=2, env_vars={"LUMOS_TEST_ENV": "on"})
    with WorkerGroup.start(spec) as group:
        group.launch(collectives, kwargs={"base": 100}, session_info={"run": "r"})
        group.send("to-all")
        group.send("to-0", ranks=[0])
        group.send("to-1", ranks=[1])
        events = _poll_until(group, _ended(2))
    results = sorted(e.result for e in events if isinstance(e, FinishedEvent))
    assert results == [
        (0, 100, ["to-all", "to-0"], "on", {"run": "r"}),
        (1, 100, ["to-all", "to-1"], "on", {"run": "r"}),
    ]
    assert not any(isinstance(e, ReportEvent) for e in events)  # collectives never surface


def test_request_stop_finishes_stopped_and_group_is_reusable() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(wait_for_stop)
        _poll_until(group, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)
        group.request_stop()
        events = _poll_until(group, _ended(2))
        assert sorted((e.rank, e.stopped) for e in events if isinstance(e, FinishedEvent)) == [
            (0, True),
            (1, True),
        ]
        group.launch(emit_many, kwargs={"n": 3})  # same actors, new session
        events = _poll_until(group, _ended(2))
        assert sorted(e.seq for e in events if isinstance(e, ReportEvent) and e.rank == 0) == [
            0,
            1,
            2,
        ]


def test_sigkill_reported_as_died_quickly() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(wait_for_stop)
        _poll_until(group, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)
        victim = group.workers[1]
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        events = _poll_until(
            group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs), 60
        )
        latency = time.monotonic() - killed_at
        died = [e for e in events if isinstance(e, WorkerDiedEvent)]
        print(f"\nSIGKILL -> WorkerDiedEvent in {latency * 1000:.0f} ms")
        assert [e.rank for e in died] == [1]
        assert died[0].node_id == victim.node_id
        assert latency < 5.0  # issue target 1 s; generous bound for a loaded machine
        assert died[0].reason


def test_sigstop_reported_as_hung_then_replaced() -> None:
    spec = WorkerGroupSpec(num_workers=2, health_check_timeout_s=1.0)
    with WorkerGroup.start(spec) as group:
        group.launch(wait_for_stop)
        _poll_until(group, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)
        victim = group.workers[0]
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            events = _poll_until(
                group, lambda evs: any(isinstance(e, WorkerHungEvent) for e in evs), 60
            )
            waited = time.monotonic() - stopped_at
            hung = [e for e in events if isinstance(e, WorkerHungEvent)]
            print(
                f"\nSIGSTOP -> WorkerHungEvent in {waited:.2f} s (waited_s={hung[0].waited_s:.2f})"
            )
            assert [e.rank for e in hung] == [0]
            assert hung[0].waited_s >= spec.health_check_timeout_s
            assert not any(
                isinstance(e, (WorkerHungEvent, WorkerDiedEvent)) and e.rank == 1 for e in events
            )
            # the stopped process is killed (not resumed) and rank 0 gets a new actor
            group.replace_workers([0])
            wait_until_process_gone(victim.pid, 30)
        finally:
            if process_running(victim.pid):
                os.kill(victim.pid, signal.SIGCONT)  # let Ray's kill finish it
        assert group.workers[0].pid != victim.pid
        group.request_stop()  # rank 1 is still waiting; end it, then run on both again
        _poll_until(group, lambda evs: any(isinstance(e, FinishedEvent) for e in evs))
        group.launch(emit_many, kwargs={"n": 2})
        events = _poll_until(group, _ended(2))
        assert sorted(e.result for e in events if isinstance(e, FinishedEvent)) == [2, 2]


def test_replace_workers_keeps_survivors() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        before = [w.pid for w in group.workers]
        os.kill(before[1], signal.SIGKILL)
        _poll_until(group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs), 60)
        group.replace_workers([1])
        after = [w.pid for w in group.workers]
        assert after[0] == before[0]
        assert after[1] != before[1]
        assert [w.world_rank for w in group.workers] == [0, 1]
        group.launch(emit_many, kwargs={"n": 5})
        events = _poll_until(group, _ended(2))
        assert sorted(e.result for e in events if isinstance(e, FinishedEvent)) == [5, 5]


def test_execute_collects_every_rank_error() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        with pytest.raises(WorkerGroupError) as info:
            group.execute(_fail_deep, 7)
        assert set(info.value.errors) == {0, 1}
        assert all("_fail_deep" in e.traceback for e in info.value.errors.values())


def test_shutdown_kills_user_thread_that_ignores_stop_after_grace() -> None:
    group = WorkerGroup.start(WorkerGroupSpec(num_workers=2))
    group.launch(ignore_stop)
    _poll_until(group, lambda evs: sum(isinstance(e, ReportEvent) for e in evs) >= 2)
    t0 = time.monotonic()
    group.shutdown(grace_period_s=0.5)
    assert time.monotonic() - t0 < 30
    group.shutdown()  # idempotent
    with pytest.raises(WorkerGroupError, match="shut down"):
        group.poll(0)


def _crash_inside_with() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(ignore_stop)
        raise RuntimeError("owner crashed")


def test_owner_exception_inside_with_releases_everything() -> None:
    with pytest.raises(RuntimeError, match="owner crashed"):
        _crash_inside_with()


def test_unplaceable_group_times_out_and_releases() -> None:
    spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 3}, placement_timeout_s=1.0)
    with pytest.raises(WorkerGroupStartError, match=r"placement_timeout_s=1\.0"):
        WorkerGroup.start(spec)


def test_waiting_for_resources_is_reported_to_on_waiting() -> None:
    # 2 x 3 CPUs never fit on the 4-CPU cluster: the caller hears why it waits, early.
    # Another placement group holds 1 CPU: Ray's bookkeeping resources of a placed group
    # (bundle_group_0_<id>=999.999, ...) are in the cluster's table but not in the line.
    other = ray.util.placement_group([{"CPU": 1}])
    ray.get(other.ready(), timeout=60)
    spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 3}, placement_timeout_s=12.0)
    messages: list[str] = []
    try:
        with pytest.raises(WorkerGroupStartError, match=r"placement_timeout_s=12\.0") as err:
            WorkerGroup.start(spec, on_waiting=messages.append)
    finally:
        ray.util.remove_placement_group(other)
    assert len(messages) == 1  # first after ~3 s, the next would come 15 s later
    assert messages[0].startswith("waiting for resources: 0 of 2 worker(s) started")
    assert "2 worker(s) x {'CPU': 3}" in messages[0]
    assert "placement_strategy='PACK'" in messages[0]
    assert "free in the cluster now: CPU=3, GPU=2, memory=" in messages[0]
    for text in (messages[0], str(err.value)):
        assert "_group_" not in text, text
        assert "node:" not in text, text


def _sitecustomize_dir() -> str:
    import sys

    return os.path.dirname(sys.modules["sitecustomize"].__file__ or "")


def test_a_healthy_start_whose_processes_are_slow_does_not_wait_for_resources(
    tmp_path: Path,
) -> None:
    # The group is placed at once; each worker process then takes ~5 s to start (a
    # sitecustomize that sleeps, like a busy node): no "waiting for resources" line.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(5)\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    spec = WorkerGroupSpec(
        num_workers=2,
        resources_per_worker={"CPU": 1},
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    messages: list[str] = []
    t0 = time.monotonic()
    with WorkerGroup.start(spec, on_waiting=messages.append) as group:
        assert group.execute(_sitecustomize_dir) == [str(tmp_path)] * 2  # it slept
    assert time.monotonic() - t0 > 5.0
    assert messages == []


def _refuse_to_load() -> None:
    raise ImportError("this class only exists on the workers")


class OnlyOnWorkers:
    """Pickles fine in the worker; unpickling it (in the owner) fails."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_to_load, ())


def emit_unloadable() -> str:
    session = worker.get_session()
    assert session is not None
    session.emit(OnlyOnWorkers())
    session.receive(timeout_s=60)
    return "still alive"


def test_events_that_do_not_unpickle_in_owner_become_error_event() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=1)) as group:
        group.launch(emit_unloadable)
        events = _poll_until(group, lambda evs: len(evs) >= 1)
        assert isinstance(events[0], ErrorEvent)
        assert "could not be unpickled in the owner" in events[0].error.message
        group.send("go on")  # the worker itself is fine and keeps being polled
        events = _poll_until(group, _ended(1))
        assert [e.result for e in events if isinstance(e, FinishedEvent)] == ["still alive"]


def _cuda_visible() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_gpu_workers_get_distinct_gpu_ids_and_spread_resources() -> None:
    spec = WorkerGroupSpec(
        num_workers=2, resources_per_worker={"CPU": 1, "GPU": 1}, placement_strategy="SPREAD"
    )
    with WorkerGroup.start(spec) as group:
        ids = [w.gpu_ids for w in group.workers]
        assert sorted(i for gpu in ids for i in gpu) == [0, 1]
        assert all(len(g) == 1 for g in ids)
        assert group.execute(_cuda_visible) == [str(g[0]) for g in ids]


def test_launch_while_previous_function_runs_is_an_error_event() -> None:
    with WorkerGroup.start(WorkerGroupSpec(num_workers=1)) as group:
        group.launch(wait_for_stop)
        _poll_until(group, lambda evs: any(isinstance(e, ReportEvent) for e in evs))
        group.launch(wait_for_stop)
        events = _poll_until(group, lambda evs: any(isinstance(e, ErrorEvent) for e in evs))
        (err,) = [e.error for e in events if isinstance(e, ErrorEvent)]
        assert "still running" in err.message
        group.request_stop()
        events = _poll_until(group, _ended(1))
        assert [(e.rank, e.stopped) for e in events if isinstance(e, FinishedEvent)] == [(0, True)]


def warm_state(module: str) -> tuple[bool, str | None, int]:
    import sys

    return module in sys.modules, os.environ.get("OMP_NUM_THREADS"), os.getpid()


def _standby_pid(group: WorkerGroup) -> int:
    meta = group._standby.ready_meta(timeout_s=60)
    assert meta is not None, "no standby worker"
    return int(meta["pid"])


def test_a_standby_worker_takes_over_a_dead_rank_then_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lumos.runtime._internal import standby as standby_module

    monkeypatch.setattr(standby_module, "STANDBY_RESPAWN_DELAY_S", 0.0)
    # A module nothing in a worker imports by itself: only the standby's warm-up does.
    warm = "xml.dom.minidom"
    spec = WorkerGroupSpec(
        num_workers=2, resources_per_worker={"CPU": 1}, standby=True, warm_imports=(warm,)
    )
    with WorkerGroup.start(spec) as group:
        group.launch(warm_state, args=(warm,))
        events = _poll_until(group, _ended(2))
        assert {e.result[0] for e in events if isinstance(e, FinishedEvent)} == {False}
        # It reserves nothing: the group's two CPUs are the only ones taken. (Ray's view
        # of free resources lags a little behind the previous test's clean-up.)
        free: list[float] = []
        for _ in range(100):  # bounded: 10 s
            free.append(ray.available_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
            if free[-1] == 2.0:
                break
            time.sleep(0.1)
        assert free[-1] == 2.0, free[-5:]
        for kill_round in range(2):  # the second kill is covered by the respawned standby
            standby = _standby_pid(group)
            before = [w.pid for w in group.workers]
            os.kill(before[1], signal.SIGKILL)
            _poll_until(group, lambda evs: any(isinstance(e, WorkerDiedEvent) for e in evs), 60)
            group.replace_workers([1])
            assert [w.pid for w in group.workers] == [before[0], standby], kill_round
            group.launch(warm_state, args=(warm,))
            events = _poll_until(group, _ended(2))
            by_rank = {e.rank: e.result for e in events if isinstance(e, FinishedEvent)}
            assert by_rank[1] == (True, "1", standby)  # warmed, threads as a 1-CPU worker
            assert by_rank[0][0] is False
    # shutdown kills the standby too (the no_leaks fixture checks for leftover actors)


def test_no_standby_for_gpu_workers_and_a_bad_warm_imports_is_named() -> None:
    spec = WorkerGroupSpec(num_workers=1, resources_per_worker={"CPU": 1, "GPU": 1}, standby=True)
    assert not spec.uses_standby
    with pytest.raises(ValueError, match=r"warm_imports=.*tuple of module names"):
        WorkerGroupSpec(num_workers=1, warm_imports=["torch"])  # type: ignore[arg-type]


def test_a_slow_import_of_the_user_module_is_not_taken_for_a_hang() -> None:
    # Unpickling the function imports its module in the worker; a 6 s import with a 1 s
    # health check must not be reported hung (it was: the launch call did the import).
    import slow_import_fns

    spec = WorkerGroupSpec(num_workers=2, health_check_timeout_s=1.0)
    with WorkerGroup.start(spec) as group:
        group.launch(slow_import_fns.report_once)
        events = _poll_until(group, _ended(2), 120)
        assert not [e for e in events if isinstance(e, (WorkerHungEvent, WorkerDiedEvent))]
        assert sorted(e.rank for e in events if isinstance(e, FinishedEvent)) == [0, 1]
        assert sum(isinstance(e, ReportEvent) for e in events) == 2
