"""Test helpers for this and other packages.

* ``s3_server``: a real S3 API (moto's server) on loopback. Needs the ``test`` extra
  (``pip install 'lumos-storage[test]'``): moto[server] and s3fs.
* ``FaultyFileSystem``: an fsspec filesystem that wraps another one and fails a seeded
  fraction of its operations, for chaos tests of anything that stores runs;
  ``S3Server.faulty_filesystem`` puts one in front of the moto server.
* ``retry_policy`` / ``FAST_RETRY_POLICY``: millisecond back-offs for those tests.
* ``process_running``: whether a pid on this host runs (a zombie or a reused pid does not),
  the check a lease makes of its holder.

Example:
    >>> from lumos.storage.testing import s3_server
    >>> with s3_server() as s3:                          # doctest: +SKIP
    ...     s3.create_bucket("runs")
    ...     storage = RunStorage("runs/exp", "run-1", filesystem=s3.filesystem())
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal.fault_schedule import (
    FAULT_KINDS as FAULT_KINDS,
    FAULTS_ENV as FAULTS_ENV,
    FAULTS_FILE_ENV as FAULTS_FILE_ENV,
    read_fault_records as read_fault_records,
)
from lumos.storage._internal.faults import FaultyFileSystem as FaultyFileSystem
from lumos.storage._internal.lease import process_running as process_running
from lumos.storage._internal.retry import RetryPolicy, set_retry_policy

DUMMY_KEY = "lumos-testing"
"""Access key the S3 clients of ``s3_filesystem`` send (moto accepts any)."""

DUMMY_SECRET = "lumos-testing-secret"
"""Secret key the S3 clients of ``s3_filesystem`` send."""

REGION = "us-west-2"
"""Region the S3 clients of ``s3_filesystem`` use."""


def _require(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"lumos.storage.testing needs {package} for its S3 server: "
            f"pip install 'lumos-storage[test]' (missing: {exc.name})"
        ) from exc


def s3_filesystem(endpoint_url: str, **kwargs: Any) -> AbstractFileSystem:
    """An s3fs filesystem talking to ``endpoint_url`` with dummy credentials.

    Listings are not cached and the instance is not shared, so every listing
    sees the server's current state.
    """
    s3fs = _require("s3fs", "s3fs")
    options: dict[str, Any] = {
        "anon": False,
        "key": DUMMY_KEY,
        "secret": DUMMY_SECRET,
        "client_kwargs": {"endpoint_url": endpoint_url, "region_name": REGION},
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }
    options.update(kwargs)
    fs: AbstractFileSystem = s3fs.S3FileSystem(**options)
    return fs


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server.

    Attributes:
        endpoint_url: ``http://127.0.0.1:<port>``.
    """

    endpoint_url: str

    def filesystem(self, **kwargs: Any) -> AbstractFileSystem:
        """A fresh s3fs filesystem for this server (see ``s3_filesystem``)."""
        return s3_filesystem(self.endpoint_url, **kwargs)

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique name when None) and return its name."""
        bucket = name or f"lumos-{uuid.uuid4().hex[:12]}"
        fs = self.filesystem()
        fs.mkdir(bucket)
        return bucket

    def faulty_filesystem(
        self, seed: int = 4, max_consecutive: int = 3, **settings: Any
    ) -> FaultyFileSystem:
        """This server's filesystem behind :class:`FaultyFileSystem` (seeded faults).

        ``settings`` are ``FaultyFileSystem``'s, such as ``write_failure_rate=0.3``;
        ``max_consecutive`` bounds the faults in a row, so that :data:`FAST_RETRY_POLICY`
        always gets through a transient one.
        """
        return FaultyFileSystem(
            self.filesystem(), seed=seed, max_consecutive=max_consecutive, **settings
        )


FAST_RETRY_POLICY = RetryPolicy(
    max_attempts=8, initial_backoff_s=0.001, max_backoff_s=0.01, max_total_s=30.0
)
"""The retry policy for tests of injected faults: the same attempts, millisecond back-offs."""


@contextlib.contextmanager
def retry_policy(policy: RetryPolicy = FAST_RETRY_POLICY) -> Iterator[RetryPolicy]:
    """Use ``policy`` for every storage operation of this process inside the block.

    Example (a pytest fixture)::

        @pytest.fixture(autouse=True)
        def fast_retries():
            with retry_policy():
                yield
    """
    previous = set_retry_policy(policy)
    try:
        yield policy
    finally:
        set_retry_policy(previous)


def _wait_until_listening(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise TimeoutError(f"moto S3 server on {host}:{port} did not accept connections: {last}")


@contextlib.contextmanager
def s3_server(start_timeout_s: float = 30.0) -> Iterator[S3Server]:
    """Run moto's S3 server on 127.0.0.1 with a free port for the duration of the block.

    Sets no environment variables: clients get the endpoint and dummy
    credentials explicitly (``S3Server.filesystem()``).

    Args:
        start_timeout_s: How long to wait for the server to accept connections.

    Yields:
        The running server.
    """
    server_mod = _require("moto.server", "moto[server]")
    _require("s3fs", "s3fs")
    # werkzeug logs every request at INFO; keep test output readable (restored on exit).
    werkzeug_logger = logging.getLogger("werkzeug")
    old_level = werkzeug_logger.level
    werkzeug_logger.setLevel(logging.WARNING)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        _wait_until_listening(host, port, start_timeout_s)
        yield S3Server(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()
        werkzeug_logger.setLevel(old_level)
