"""Fixtures of the hosts scenarios: one cluster of real hosts per session.

``cluster`` builds the hosts (``hosts.py``), starts Ray and S3 on them
(``host_cluster.py``) and tears everything down at the end of the session, however
it ends. Where network namespaces cannot be made, every test here is skipped with
one line saying why. ``hosts_cluster`` (per test) first brings the cluster back to
its roles: a host an earlier scenario killed or partitioned is booted again.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from host_cluster import DRIVER_HOST, N_HOSTS, OBSERVER, HostCluster  # noqa: E402
from hosts import Hosts, unavailable_reason  # noqa: E402


@pytest.fixture(scope="session")
def _cluster() -> Iterator[HostCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # The observer shares the driver host's hostname (two machines named alike).
    with Hosts(N_HOSTS, hostnames={OBSERVER: f"lumos-h{DRIVER_HOST}"}) as hosts:
        cluster = HostCluster(hosts)
        cluster.start()
        yield cluster


@pytest.fixture
def hosts_cluster(_cluster: HostCluster) -> HostCluster:
    """The session's hosts with their roles restored (see ``host_cluster.py``)."""
    _cluster.restore()
    return _cluster
