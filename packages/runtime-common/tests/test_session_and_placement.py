from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lumos.runtime import StopRequested, WorkerGroupSpec, WorkerInfo, worker
from lumos.runtime._internal.actor import serialize_batch
from lumos.runtime._internal.multiplexer import decode, long_poll_wait_s
from lumos.runtime._internal.placement import actor_options, assign_ranks
from lumos.runtime._internal.session import EventQueue, WorkerSession
from lumos.runtime.testing import FakeWorkerPool


class _SignalingCondition(threading.Condition):
    """A Condition that sets ``waiting`` when a thread starts waiting on it.

    Another thread that then takes the lock (``notify``) runs only once the waiter
    released it inside ``wait``: the wake-up path is taken for sure, with no sleep.
    """

    def __init__(self) -> None:
        super().__init__(threading.Lock())
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def _when_waiting(cond: _SignalingCondition, action: Any) -> threading.Thread:
    """Run ``action()`` in a thread once someone waits on ``cond``."""

    def run() -> None:
        if cond.waiting.wait(30):
            action()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _session(world_size: int = 1) -> tuple[WorkerSession, EventQueue]:
    q = EventQueue()
    info = WorkerInfo(0, world_size, 0, world_size, 0, "n", "127.0.0.1", 1, [])
    return WorkerSession(info, {"trial": "t1"}, q), q


def test_emit_is_ordered_and_drained_in_one_batch() -> None:
    s, q = _session()
    for i in range(1000):
        s.emit({"i": i})
    batch = q.drain(0)
    assert [seq for _, seq, _ in batch] == list(range(1000))
    assert [p["i"] for _, _, p in batch] == list(range(1000))
    assert q.drain(0) == []


def test_drain_waits_for_first_item_from_another_thread() -> None:
    s, q = _session()
    cond = q._cond = _SignalingCondition()
    t = _when_waiting(cond, lambda: s.emit("late"))
    batch = q.drain(30.0)
    t.join()
    assert cond.waiting.is_set()
    assert [p for _, _, p in batch] == ["late"]


def test_receive_in_order_timeout_and_stop() -> None:
    s, _ = _session()
    s.deliver(1)
    s.deliver(2)
    assert s.receive(0) == 1
    assert s.receive(0) == 2
    with pytest.raises(TimeoutError):
        s.receive(timeout_s=0.01)
    assert not s.stop_requested
    assert not s.stop_event.is_set()
    cond = s._cond = _SignalingCondition()
    t = _when_waiting(cond, s.request_stop)
    with pytest.raises(StopRequested):
        s.receive()
    t.join()
    assert cond.waiting.is_set()
    assert s.stop_requested
    assert s.stop_event.is_set()
    with pytest.raises(StopRequested):
        s.raise_if_stop_requested()


def test_single_worker_collectives_are_local() -> None:
    s, q = _session(world_size=1)
    s.barrier()
    assert s.broadcast_from_rank_zero(7) == 7
    assert q.drain(0) == []
    assert s.session_info == {"trial": "t1"}


def test_barrier_unblocks_on_stop() -> None:
    s, _ = _session(world_size=2)
    cond = s._cond = _SignalingCondition()
    t = _when_waiting(cond, s.request_stop)
    with pytest.raises(StopRequested):
        s.barrier()
    t.join()
    assert cond.waiting.is_set()


def test_get_session_outside_worker_is_none() -> None:
    assert worker.get_session() is None


def test_unpicklable_report_becomes_error_event() -> None:
    s, q = _session()
    s.emit({"ok": 1})
    s.emit({"lock": threading.Lock()})
    import pickle

    raws = pickle.loads(serialize_batch(q.drain(0)))
    events = [decode(0, r, None) for r in raws]
    assert events[0].payload == {"ok": 1}  # type: ignore[union-attr]
    assert type(events[1]).__name__ == "ErrorEvent"
    assert "does not pickle" in events[1].error.message  # type: ignore[union-attr]


def test_assign_ranks_contiguous_per_node_owner_first() -> None:
    metas: list[dict[str, Any]] = [
        {"node_id": "b", "node_ip": "10.0.0.2", "pid": 1, "gpu_ids": [0]},
        {"node_id": "a", "node_ip": "10.0.0.1", "pid": 2, "gpu_ids": []},
        {"node_id": "b", "node_ip": "10.0.0.2", "pid": 3, "gpu_ids": [1]},
        {"node_id": "c", "node_ip": "10.0.0.3", "pid": 4, "gpu_ids": []},
        {"node_id": "a", "node_ip": "10.0.0.1", "pid": 5, "gpu_ids": []},
    ]
    order, infos = assign_ranks(metas, owner_node_id="a")
    assert order == [1, 4, 0, 2, 3]
    assert [i.node_id for i in infos] == ["a", "a", "b", "b", "c"]
    assert [i.world_rank for i in infos] == [0, 1, 2, 3, 4]
    assert [i.local_rank for i in infos] == [0, 1, 0, 1, 0]
    assert [i.local_world_size for i in infos] == [2, 2, 2, 2, 1]
    assert [i.node_rank for i in infos] == [0, 0, 1, 1, 2]
    assert infos[3].gpu_ids == [1]
    assert infos[3].pid == 3
    assert all(i.world_size == 5 for i in infos)


def test_assign_ranks_owner_elsewhere_keeps_first_appearance() -> None:
    metas = [{"node_id": n, "node_ip": "x", "pid": p, "gpu_ids": []} for p, n in enumerate("babc")]
    order, infos = assign_ranks(metas, owner_node_id="zzz")
    assert order == [0, 2, 1, 3]
    assert [i.node_rank for i in infos] == [0, 0, 1, 2]


def test_actor_options() -> None:
    assert actor_options({"CPU": 2}) == {"num_cpus": 2.0}
    assert actor_options({"CPU": 1, "GPU": 1, "memory": 1e9, "TPU": 4}) == {
        "num_cpus": 1.0,
        "num_gpus": 1.0,
        "memory": 1e9,
        "resources": {"TPU": 4},
    }


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_workers": 0}, "num_workers"),
        ({"num_workers": 2, "resources_per_worker": {"CPU": -1}}, "resources_per_worker"),
        ({"num_workers": 2, "resources_per_worker": {}}, "resources_per_worker"),
        ({"num_workers": 2, "resources_per_worker": {"CPU": 0}}, "resources_per_worker"),
        ({"num_workers": 2, "placement_strategy": "RANDOM"}, "placement_strategy"),
        ({"num_workers": 2, "env_vars": {"A": 1}}, "env_vars"),
        ({"num_workers": 2, "placement_timeout_s": 0}, "placement_timeout_s"),
        ({"num_workers": 2, "health_check_timeout_s": -1}, "health_check_timeout_s"),
    ],
)
def test_spec_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        WorkerGroupSpec(**kwargs)


def test_spec_defaults() -> None:
    spec = WorkerGroupSpec(num_workers=2)
    assert spec.resources_per_worker == {"CPU": 1.0}
    assert spec.placement_strategy == "PACK"
    assert spec.health_check_timeout_s == 10.0


def test_long_poll_wait_is_bounded() -> None:
    assert long_poll_wait_s(10.0) == 2.0
    assert long_poll_wait_s(1.0) == 0.5
    assert long_poll_wait_s(0.01) == 0.2


def test_fake_pool_capacity_and_reuse() -> None:
    def objective(x: int) -> int:
        s = worker.get_session()
        assert s is not None
        assert s.info is None
        s.emit({"x": x, "trial": s.session_info["trial"]})
        return x + 1

    with FakeWorkerPool({"CPU": 1}, capacity=1) as pool:
        a, b = pool.add_worker(), pool.add_worker()
        assert pool.ready(a)
        assert not pool.ready(b)
        assert pool.pending_workers() == [b]
        results: dict[str, Any] = {}
        for trial, x in (("t0", 1), ("t1", 2)):
            pool.launch(a, objective, kwargs={"x": x}, session_info={"trial": trial})
            deadline = time.monotonic() + 30
            while trial not in results and time.monotonic() < deadline:
                for ev in pool.poll(5.0):
                    if type(ev).__name__ == "ReportEvent":
                        assert ev.payload["trial"] == trial  # type: ignore[union-attr]
                    if type(ev).__name__ == "FinishedEvent":
                        results[trial] = ev.result  # type: ignore[union-attr]
        assert results == {"t0": 2, "t1": 3}
        pool.remove_worker(a)
        assert pool.pending_workers() == []
        assert pool.ready(b)


def test_process_session_set_while_running_and_cleared_after() -> None:
    from lumos.runtime._internal import session as session_mod

    s, q = _session()
    seen: list[object] = []
    session_mod.run_user_fn(s, lambda: seen.append(worker.get_session()), (), {}, q, lambda e: None)
    assert seen == [s]
    assert worker.get_session() is None
    kinds = [k for k, _, _ in q.drain(0)]
    assert kinds == ["F"]


def test_threads_the_user_function_starts_see_its_session() -> None:
    from lumos.runtime._internal import session as session_mod

    s, q = _session()
    seen: list[object] = []

    def fn() -> None:
        t = threading.Thread(target=lambda: seen.append(worker.get_session()))
        t.start()
        t.join(30)

    user_thread = threading.Thread(
        target=session_mod.run_user_fn, args=(s, fn, (), {}, q, lambda e: None)
    )
    user_thread.start()
    user_thread.join(30)
    assert seen == [s]
    assert worker.get_session() is None


def test_newer_session_is_not_cleared_by_older_thread() -> None:
    from lumos.runtime._internal import session as session_mod

    old, old_q = _session()
    new, _ = _session()
    old_started, old_may_end = threading.Event(), threading.Event()

    def old_fn() -> None:
        old_started.set()
        old_may_end.wait(30)

    older = threading.Thread(
        target=session_mod.run_user_fn, args=(old, old_fn, (), {}, old_q, lambda e: None)
    )
    older.start()
    assert old_started.wait(30)
    session_mod.current_session.activate(new)  # a newer launch, in this thread
    try:
        old_may_end.set()
        older.join(30)  # the older thread ends: deactivates only its own session
        assert worker.get_session() is new
        seen: list[object] = []
        t = threading.Thread(target=lambda: seen.append(worker.get_session()))
        t.start()
        t.join(30)
        assert seen == [new]  # a thread of the newer job sees it too
    finally:
        session_mod.current_session.deactivate(new)
    assert worker.get_session() is None


def test_pool_and_group_resource_rules() -> None:
    from lumos.runtime import validate_resources

    validate_resources({"CPU": 0}, allow_zero=True)
    with pytest.raises(ValueError, match="bundle cannot be empty"):
        validate_resources({"CPU": 0})
    with pytest.raises(ValueError, match=r"resources_per_worker\['GPU'\]"):
        validate_resources({"GPU": -1}, allow_zero=True)
