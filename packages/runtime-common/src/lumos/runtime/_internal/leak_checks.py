"""Ray hygiene checks for tests on a real cluster: no actor or placement group left alive,
and no process of a dead driver or removed worker still running.

The actor and group checks read Ray's state API, which the dashboard serves: start Ray with
``include_dashboard=True``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from lumos.storage.testing import process_running

_api_server_urls: dict[str, str] = {}


@contextlib.contextmanager
def _state_api_of_connected_cluster() -> Iterator[None]:
    """Point Ray's state API at the cluster this process is connected to.

    The state API otherwise follows ``RAY_ADDRESS`` (e.g. ``local``) or guesses, which
    fails or picks another cluster when several local Ray instances run on the machine.
    ``RAY_API_SERVER_ADDRESS`` takes precedence over both, so it is set for the call.
    """
    import ray
    from ray.dashboard.utils import ray_address_to_api_server_url

    gcs = str(ray.get_runtime_context().gcs_address)
    url = _api_server_urls.get(gcs)
    if url is None:
        url = _api_server_urls[gcs] = str(ray_address_to_api_server_url(gcs))
    old = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = old


def alive_actors() -> list[Any]:
    """Actors of the connected cluster that are not DEAD (Ray state API; needs the dashboard)."""
    from ray.util.state import list_actors

    with _state_api_of_connected_cluster():
        actors = list_actors(limit=10_000, raise_on_missing_output=False)
    return [a for a in actors if a.state != "DEAD"]


def alive_placement_groups() -> list[Any]:
    """Placement groups of the connected cluster that are not REMOVED (Ray state API)."""
    from ray.util.state import list_placement_groups

    with _state_api_of_connected_cluster():
        pgs = list_placement_groups(limit=10_000, raise_on_missing_output=False)
    return [p for p in pgs if p.state != "REMOVED"]


def assert_no_leaked_actors(timeout_s: float = 30.0, ignore_names: Iterable[str] = ()) -> None:
    """Assert every actor is DEAD and every placement group REMOVED.

    Killing is asynchronous, so this re-checks (bounded by ``timeout_s``) before failing.
    Needs Ray started with the dashboard (``ray.init(include_dashboard=True)``), which
    serves the state API.

    Args:
        timeout_s: How long to wait for late deaths.
        ignore_names: Actor names (``name=``) that may stay alive (e.g. test fixtures).
    """
    ignored = set(ignore_names)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        actors = [a for a in alive_actors() if (a.name or "") not in ignored]
        pgs = alive_placement_groups()
        if not actors and not pgs:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(
                "leaked Ray resources: actors "
                + repr([(a.class_name, a.state, a.pid) for a in actors])
                + ", placement groups "
                + repr([(p.placement_group_id, p.state) for p in pgs])
            )
        time.sleep(delay)  # no event to wait on: the state API is poll-only
        delay = min(delay * 2, 1.0)


def wait_until_process_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until process ``pid`` on this host has ended (Ray ends a dead driver's or a
    removed worker's process soon, not at once); AssertionError after ``timeout_s``.

    Example:
        >>> wait_until_process_gone(worker_pid, timeout_s=60)  # doctest: +SKIP
    """
    deadline = time.monotonic() + timeout_s
    while process_running(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout_s} s"
        time.sleep(0.1)  # another process's end: nothing of ours to wait on
