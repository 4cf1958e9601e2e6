"""A simulated multi-node Ray cluster, one per session (``nox -s train`` runs this
folder in a pytest process of its own: one process joins one Ray cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """Head node with 0 CPUs (the driver's) and two 1-CPU worker nodes."""
    import health_fns
    import ray
    from ray import cloudpickle

    from lumos.runtime.testing import simulated_cluster

    if ray.is_initialized():
        pytest.skip("run `pytest packages/train/tests/cluster` in a process of its own")
    cloudpickle.register_pickle_by_value(health_fns)
    with simulated_cluster((1, 1)) as c:
        yield c
