"""CurrentSlot ("which session is current") and ensure_ray (the one ray.init())."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from lumos.runtime import CurrentSlot, ensure_ray


def _in_thread(fn: Any) -> list[Any]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out


def test_empty_slot_is_none_everywhere() -> None:
    slot: CurrentSlot[str] = CurrentSlot()
    assert slot.get() is None
    assert _in_thread(slot.get) == [None]


def test_activating_thread_and_other_threads_see_the_only_session() -> None:
    slot: CurrentSlot[str] = CurrentSlot()
    slot.activate("job-1")
    assert slot.get() == "job-1"
    assert _in_thread(slot.get) == ["job-1"]  # e.g. a thread the user function started
    slot.deactivate("job-1")
    assert slot.get() is None
    assert _in_thread(slot.get) == [None]


def test_several_active_sessions_each_thread_sees_its_own_others_see_none() -> None:
    slot: CurrentSlot[str] = CurrentSlot()
    a_active, b_seen, a_may_end = threading.Event(), [], threading.Event()
    a_seen: list[str | None] = []

    def worker_a() -> None:
        slot.activate("a")
        a_active.set()
        a_may_end.wait(30)
        a_seen.append(slot.get())
        slot.deactivate("a")

    t = threading.Thread(target=worker_a)
    t.start()
    assert a_active.wait(30)
    slot.activate("b")
    b_seen.append(slot.get())
    assert _in_thread(slot.get) == [None]  # two active: no guessing
    a_may_end.set()
    t.join(30)
    assert a_seen == ["a"]
    assert b_seen == ["b"]
    assert _in_thread(slot.get) == ["b"]  # only b is left
    slot.deactivate("b")


def test_deactivate_removes_only_that_session() -> None:
    slot: CurrentSlot[str] = CurrentSlot()
    slot.activate("new")
    _in_thread(lambda: slot.deactivate("old"))  # an older job's thread ending
    slot.deactivate("old")
    assert slot.get() == "new"
    assert _in_thread(slot.get) == ["new"]
    slot.deactivate("new")
    slot.deactivate("new")  # a no-op the second time
    assert slot.get() is None


def test_ensure_ray_connects_once_with_no_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    state = {"up": False}

    def fake_init(*args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))
        state["up"] = True

    monkeypatch.setattr(ray, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(ray, "init", fake_init)
    ensure_ray()
    ensure_ray()
    assert calls == [((), {})]


def test_ensure_ray_keeps_an_existing_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ray.init() must not be called when Ray is connected")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "init", fail)
    ensure_ray()


def test_the_fakes_never_connect_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from lumos.runtime import FinishedEvent, WorkerGroupSpec, worker
    from lumos.runtime.testing import FakeCluster, FakeWorkerPool

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a fake must not start Ray")

    monkeypatch.setattr(ray, "init", fail)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def fn() -> bool:
        return worker.get_session() is not None

    with FakeCluster().start(WorkerGroupSpec(num_workers=2)) as group:
        group.launch(fn)
        events: list[Any] = []
        while sum(isinstance(e, FinishedEvent) for e in events) < 2:
            events += group.poll(30.0)
    assert [e.result for e in events if isinstance(e, FinishedEvent)] == [True, True]
    with FakeWorkerPool({"CPU": 1}) as pool:
        pool.launch(pool.add_worker(), fn)
        events = []
        while not any(isinstance(e, FinishedEvent) for e in events):
            events += pool.poll(30.0)
    assert [e.result for e in events if isinstance(e, FinishedEvent)] == [True]
