"""Shared fixtures: ONE local Ray cluster per pytest session (only for tests that ask)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A 4-CPU local Ray cluster with the dashboard (the state API needs it).

    Two logical GPUs (no hardware needed) let the tests check GPU bookkeeping.
    """
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The dashboard (it serves the state API) starts 9 module subprocesses and gives each
    # 30 s by default; on a loaded 2-core machine that is not enough.
    os.environ.setdefault("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "300")
    # Worker processes must import the test modules that define the user functions.
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        address="local",  # never attach to another session's cluster
        num_cpus=4,
        num_gpus=2,
        job_config=ray.job_config.JobConfig(code_search_path=[here, os.path.join(here, "ray")]),
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=_free_port(),
        log_to_driver=True,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def no_leaks(ray_cluster: None) -> Iterator[None]:
    """Fail the test when it leaves an actor or a placement group alive."""
    from lumos.runtime.testing import assert_no_leaked_actors

    yield
    assert_no_leaked_actors(timeout_s=30.0)
