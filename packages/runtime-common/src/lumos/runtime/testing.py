"""Test helpers: in-process fakes of WorkerGroup / WorkerPool, and Ray hygiene checks.

``FakeWorkerGroup`` and ``FakeWorkerPool`` implement the same interface as the real
classes without Ray: user functions run in threads of this process with a real
``WorkerSession`` (emit, receive, barrier, broadcast, stop all work), and failures
can be scripted (a worker dies, hangs or raises; a start fails). ``FakeCluster``
hands out scripted groups from ``start(spec)`` so a controller that takes a
``start`` callable can be unit tested.

Example:
    >>> from lumos.runtime import WorkerGroupSpec, WorkerDiedEvent
    >>> from lumos.runtime.testing import FakeCluster
    >>> cluster = FakeCluster([lambda g: g.after_reports(3, lambda g: g.kill_worker(1))])
    >>> group = cluster.start(WorkerGroupSpec(num_workers=2))
    >>> # ... drive group.launch / group.poll as the real controller would
"""

from __future__ import annotations

from lumos.runtime._internal.fake_group import FakeCluster, FakeWorkerGroup, StartAction
from lumos.runtime._internal.fake_pool import FakeWorkerPool
from lumos.runtime._internal.leak_checks import (
    alive_actors,
    alive_placement_groups,
    assert_no_leaked_actors,
    wait_until_process_gone,
)
from lumos.runtime._internal.sim_cluster import simulated_cluster
from lumos.storage.testing import process_running  # lumos-storage's, for a lease's holder too

__all__ = [
    "FakeCluster",
    "FakeWorkerGroup",
    "FakeWorkerPool",
    "StartAction",
    "alive_actors",
    "alive_placement_groups",
    "assert_no_leaked_actors",
    "process_running",
    "simulated_cluster",
    "wait_until_process_gone",
]
