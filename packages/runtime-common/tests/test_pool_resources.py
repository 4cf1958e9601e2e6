"""Per-worker resources in a worker pool (``add_worker(resources)``), on the fake pool."""

from __future__ import annotations

import pytest

from lumos.runtime import RuntimeConfigError
from lumos.runtime.testing import FakeWorkerPool


def test_each_worker_gets_its_own_resources_or_the_pools() -> None:
    pool = FakeWorkerPool({"CPU": 1.0})
    default = pool.add_worker()
    big = pool.add_worker({"CPU": 2.0, "GPU": 1.0})
    assert pool.worker_resources == {default: {"CPU": 1.0}, big: {"CPU": 2.0, "GPU": 1.0}}
    pool.shutdown()


def test_bad_worker_resources_name_the_call_and_the_value() -> None:
    pool = FakeWorkerPool({"CPU": 1.0})
    with pytest.raises(RuntimeConfigError, match=r"add_worker\(resources\)"):
        pool.add_worker({"CPU": -1.0})
    assert pool.worker_ids == []
    pool.shutdown()
