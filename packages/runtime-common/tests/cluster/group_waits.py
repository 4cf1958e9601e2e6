"""Waits the simulated-cluster tests of this folder share (plain functions, no fixtures)."""

from __future__ import annotations

import time
from collections.abc import Callable

import ray

from lumos.runtime import Event, WorkerGroup


def poll_until(
    group: WorkerGroup, done: Callable[[list[Event]], bool], timeout_s: float = 60.0
) -> list[Event]:
    """The group's events until ``done(events)``."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not done(events):
        assert time.monotonic() < deadline, f"timed out; got {events[-5:]}"
        events += group.poll(timeout_s=1.0)
    return events


def assert_released(timeout_s: float = 30.0) -> None:
    """Every worker actor dead and every placement group removed (read from the GCS;
    this cluster runs without the dashboard that ``assert_no_leaked_actors`` needs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        actors = [a for a in ray._private.state.actors().values() if a["State"] != "DEAD"]
        pgs = [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]
        if not actors and not pgs:
            return
        assert time.monotonic() < deadline, f"left alive: {actors} {pgs}"
        time.sleep(0.2)
