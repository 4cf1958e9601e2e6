"""Shared fixtures: one real Ray cluster per session, env hygiene, fake-group trainers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import health_fns  # noqa: E402
import report_fns  # noqa: E402
import train_fns  # noqa: E402


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster (num_cpus=4) shared by every integration test; yields its address."""
    import ray
    from ray import cloudpickle

    # the helper train functions are shipped by value: workers cannot import tests/
    cloudpickle.register_pickle_by_value(train_fns)
    cloudpickle.register_pickle_by_value(report_fns)
    cloudpickle.register_pickle_by_value(health_fns)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # address="local": always a fresh cluster of our own, even when another one runs here
    ctx = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=True)
    try:
        yield str(ctx.address_info["gcs_address"])
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _restore_env() -> Iterator[None]:
    """Training hooks set MASTER_ADDR & co. in-process under the fake group; undo that."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


RAY_DATA_SINGLETONS = ("_StatsActor", "_AutoscalingCoordinatorActor")
"""Cluster-wide actors that Ray Data starts on first use and keeps (Ray's, not ours)."""


def leaked() -> tuple[list[str], list[str]]:
    """Live actors and placement groups of the cluster (GCS tables; no dashboard needed),
    but for Ray Data's own singletons; the split coordinators lumos starts do count."""
    import ray
    from ray._private import state as ray_state

    actors = [
        f"{a.get('ActorClassName', '?')}:{a.get('State')}"
        for a in ray_state.actors().values()
        if a.get("State") not in ("DEAD",) and a.get("ActorClassName") not in RAY_DATA_SINGLETONS
    ]
    pgs = [
        f"{pg_id}:{info.get('state')}"
        for pg_id, info in ray.util.placement_group_table().items()
        if info.get("state") != "REMOVED"
    ]
    return actors, pgs


def wait_for_no_orphans(timeout_s: float = 60.0) -> None:
    """Wait until no actor or placement group is left (kills and a dead driver's
    clean-up are asynchronous)."""
    import time

    deadline = time.monotonic() + timeout_s
    while any(leaked()):
        assert time.monotonic() < deadline, f"left alive (actors, placement groups): {leaked()}"
        time.sleep(0.2)  # the GCS tables can only be polled


@pytest.fixture
def no_leaks(ray_cluster: str) -> Iterator[None]:
    """After the test: no live actors or placement groups left behind."""
    yield
    wait_for_no_orphans(timeout_s=30)


def run_config(tmp_path: Path, name: str = "run", **kwargs: Any) -> Any:
    from lumos import train

    kwargs.setdefault("verbose", False)
    return train.RunConfig(name=name, storage_path=str(tmp_path), **kwargs)


_BY_VALUE = (train_fns, report_fns, health_fns)
RAY_CLUSTER_FIXTURES = {"ray_cluster", "cluster"}
"""Fixtures that start a Ray cluster whose workers unpickle the shared modules by value
(``cluster`` is the simulated multi-node one in ``cluster/conftest.py``)."""


@pytest.fixture(autouse=True)
def _in_process_pickles_by_reference(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests without a Ray cluster (fake groups, in process) pickle the shared test
    functions by reference, even after ``ray_cluster`` registered them to pickle by
    value for Ray's workers: some hold an Event, which pickles only by reference."""
    if RAY_CLUSTER_FIXTURES & set(request.fixturenames):
        yield
        return
    from ray import cloudpickle

    registered = set(cloudpickle.list_registry_pickle_by_value())
    modules = [m for m in _BY_VALUE if m.__name__ in registered]
    for module in modules:
        cloudpickle.unregister_pickle_by_value(module)
    try:
        yield
    finally:
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
