"""A simulated multi-node Ray cluster (``ray.cluster_utils.Cluster``), one per session.

Its own pytest session (``nox -s runtime`` runs this folder separately): the other
runtime tests start a single-node local cluster, and one process can join only one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def cluster() -> Iterator[object]:
    """Head node with 0 CPUs (the driver's; no worker lands there) and two 1-CPU nodes."""
    import ray

    if ray.is_initialized():
        pytest.skip(
            "the multi-node cluster tests need their own pytest process: run "
            "`pytest packages/runtime-common/tests/cluster` alone (nox -s runtime does)"
        )
    from lumos.runtime.testing import simulated_cluster

    here = os.path.dirname(os.path.abspath(__file__))
    with simulated_cluster((1, 1), code_search_path=[here]) as c:
        yield c
