"""Fixtures: one Ray cluster per pytest session (only for tests that ask for it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import optuna
import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray cluster with 4 CPUs, shared by every integration test."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    # address="local": always a new cluster, never one another test session started.
    ctx = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ctx
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _quiet_optuna() -> Iterator[None]:
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    yield
    optuna.logging.set_verbosity(previous)
