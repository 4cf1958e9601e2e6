"""Fixtures for the integration tests: one Ray cluster at a time per pytest session.

* ``ray_cluster``: the plain local cluster (``ray.init(num_cpus=4)``), started
  once for the session on first use.
* ``multi_node``: a simulated 3-node cluster (``ray.cluster_utils.Cluster``). Two
  clusters cannot be connected at once, so a session-wide manager shuts the plain
  one down first; the multi-node tests are ordered last, so a session switches at
  most once.

Both fixtures check after every test that no actor and no placement group is left
alive (the Ray state API, served by the dashboard).

Ray, torch and the lumos packages are imported lazily: the lint session runs
``test_house_rules.py`` here with pytest alone.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
# `import digits` / `import demo_tune_over_train` (the demo's code, not a copy).
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

#: Per-test limit (pytest-timeout); the slowest test (S3 resume) takes 1-2 minutes on 2 cores.
DEFAULT_TIMEOUT_S = 420.0
PLAIN_CPUS = 4
NODES = 3
CPUS_PER_NODE = 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Multi-node tests last: the session then switches clusters at most once.
    items.sort(key=lambda item: item.get_closest_marker("multi_node") is not None)
    if config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Clusters:
    """Keeps at most one Ray cluster running (and connected) in this process."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.cluster: Any = None  # ray.cluster_utils.Cluster while multi-node

    @staticmethod
    def _job_config() -> Any:
        import ray

        # Workers import the shared workloads (this folder) and the demo's code (examples/).
        return ray.job_config.JobConfig(code_search_path=[str(HERE), str(EXAMPLES)])

    def plain(self) -> str:
        """Start (or keep) the plain local cluster; return its GCS address."""
        import ray

        if self.kind != "plain":
            self.shutdown()
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(
                num_cpus=PLAIN_CPUS,
                include_dashboard=True,  # the state API (leak checks) needs it
                dashboard_host="127.0.0.1",
                dashboard_port=_free_port(),
                job_config=self._job_config(),
            )
            self.kind = "plain"
        return str(ray.get_runtime_context().gcs_address)

    def multi_node(self) -> Any:
        """Start (or keep) a simulated cluster of ``NODES`` nodes; return the Cluster."""
        import ray
        from ray.cluster_utils import Cluster

        if self.kind != "multi_node":
            self.shutdown()
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": CPUS_PER_NODE,
                    "include_dashboard": True,
                    "dashboard_host": "127.0.0.1",
                    "dashboard_port": _free_port(),
                },
            )
            self.cluster = cluster
            for _ in range(NODES - 1):
                cluster.add_node(num_cpus=CPUS_PER_NODE)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, job_config=self._job_config())
            self.kind = "multi_node"
        # A test may have removed nodes: bring the cluster back to its size.
        missing = NODES - 1 - len(self.cluster.worker_nodes)
        for _ in range(missing):
            self.cluster.add_node(num_cpus=CPUS_PER_NODE)
        if missing:
            self.cluster.wait_for_nodes()
        return self.cluster

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.shutdown()
        self.kind = None


@pytest.fixture(scope="session")
def _clusters() -> Iterator[Clusters]:
    clusters = Clusters()
    try:
        yield clusters
    finally:
        clusters.shutdown()


def _assert_no_leaks(clusters: Clusters) -> None:
    """Fail the test that leaked an actor or a placement group.

    A leak (e.g. a placement group still holding CPUs) would starve the tests after
    this one, so the cluster is then shut down: the next test starts a fresh one.
    """
    from lumos.runtime.testing import assert_no_leaked_actors

    try:
        assert_no_leaked_actors(timeout_s=60.0)
    except AssertionError:
        clusters.shutdown()
        raise


@pytest.fixture
def ray_cluster(_clusters: Clusters) -> Iterator[str]:
    """The session's plain 4-CPU cluster (its GCS address); no leaks after the test."""
    address = _clusters.plain()
    yield address
    _assert_no_leaks(_clusters)


@pytest.fixture
def multi_node(_clusters: Clusters) -> Iterator[Any]:
    """A simulated 3-node cluster (2 CPUs each); no leaks after the test."""
    cluster = _clusters.multi_node()
    yield cluster
    _assert_no_leaks(_clusters)


@pytest.fixture
def storage_dir(tmp_path: Path) -> str:
    """A fresh local storage path for the test's runs and experiments."""
    path = tmp_path / "storage"
    path.mkdir()
    return str(path)
