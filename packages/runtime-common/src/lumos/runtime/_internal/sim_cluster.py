"""A simulated multi-node Ray cluster for tests (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lumos.runtime._internal.ray_init import ensure_ray


@contextmanager
def simulated_cluster(
    worker_cpus: Sequence[float] = (1, 1), code_search_path: Sequence[str] = ()
) -> Iterator[Any]:
    """A head node with 0 CPUs (the driver's; no worker lands there) and one worker
    node per entry of ``worker_cpus``; ``ensure_ray`` joins it, and both end on exit.

    One process can join one Ray cluster only: run tests that use it in a pytest
    process of their own.

    Yields:
        The ``ray.cluster_utils.Cluster`` (``add_node`` / ``remove_node`` at will).
    """
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        raise RuntimeError(
            "simulated_cluster() needs a process that has not joined a Ray cluster yet"
        )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    try:
        for cpus in worker_cpus:
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        job = ray.job_config.JobConfig(code_search_path=list(code_search_path))
        ensure_ray(cluster.address, job)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
