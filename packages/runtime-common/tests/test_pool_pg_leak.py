"""WorkerPool leaves no placement group behind a worker that ends inside ``placement_group()``.

A trial actor killed (``remove_worker``, ``ray.kill`` is asynchronous) or dying while its
nested ``WorkerGroup`` calls ``placement_group()`` can have that creation reach Ray's GCS
after the pool swept the actor's placement groups. The tests create exactly that late
group (named as the dead actor's ``WorkerGroup`` names it) right after the sweep, on a
real Ray cluster, and check the pool removes it: on a later poll, and at shutdown.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
import ray
from ray.util.placement_group import placement_group

from lumos.runtime import ReportEvent, WorkerDiedEvent, WorkerPool, worker

pytestmark = pytest.mark.usefixtures("no_leaks")


def report_actor_id_then_wait() -> None:
    session = worker.get_session()
    assert session is not None
    session.emit({"actor_id": ray.get_runtime_context().get_actor_id()})
    if session.receive() == "exit":  # otherwise: until the worker is removed
        os._exit(1)


def _actor_id_of_running_worker(pool: WorkerPool, wid: int) -> str:
    pool.launch(wid, report_actor_id_then_wait)
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        for event in pool.poll(1.0):
            if isinstance(event, ReportEvent) and event.rank == wid:
                actor_id: str = event.payload["actor_id"]
                return actor_id
    raise AssertionError("the worker did not report within 120 s")


def _late_group_of(actor_id: str) -> str:
    """What the dead actor's in-flight ``placement_group()`` leaves once it reaches the GCS."""
    name = f"lumos-wg-{actor_id}-{uuid.uuid4().hex}"
    placement_group([{"CPU": 1}], name=name)
    assert _alive(name)
    return name


def _alive(name: str) -> bool:
    table: dict[str, Any] = ray.util.placement_group_table()
    return any(
        info.get("name") == name and info.get("state") != "REMOVED" for info in table.values()
    )


def test_group_created_after_remove_worker_is_removed_by_a_later_poll() -> None:
    with WorkerPool({"CPU": 1}) as pool:
        wid = pool.add_worker()
        actor_id = _actor_id_of_running_worker(pool, wid)
        pool.remove_worker(wid)
        late = _late_group_of(actor_id)
        deadline = time.monotonic() + 30.0  # the pool re-sweeps about every second
        while _alive(late) and time.monotonic() < deadline:
            pool.poll(0.2)
        assert not _alive(late), f"placement group {late} of a removed worker leaked"


def test_group_created_after_remove_worker_is_removed_at_shutdown() -> None:
    pool = WorkerPool({"CPU": 1})
    try:
        wid = pool.add_worker()
        actor_id = _actor_id_of_running_worker(pool, wid)
        pool.remove_worker(wid)
        late = _late_group_of(actor_id)
    finally:
        pool.shutdown()
    assert not _alive(late), f"placement group {late} of a removed worker leaked"


def test_group_created_after_a_worker_died_is_removed_by_a_later_poll() -> None:
    with WorkerPool({"CPU": 1}) as pool:
        wid = pool.add_worker()
        actor_id = _actor_id_of_running_worker(pool, wid)
        pool.send(wid, "exit")  # the worker dies on its own
        deadline = time.monotonic() + 120.0
        died = False
        while not died and time.monotonic() < deadline:
            died = any(isinstance(e, WorkerDiedEvent) and e.rank == wid for e in pool.poll(1.0))
        assert died
        late = _late_group_of(actor_id)
        deadline = time.monotonic() + 30.0  # the pool re-sweeps about every second
        while _alive(late) and time.monotonic() < deadline:
            pool.poll(0.2)
        assert not _alive(late), f"placement group {late} of a dead worker leaked"
