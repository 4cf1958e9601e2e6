"""Fixtures: one moto S3 server per session; a storage location per backend."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fsspec import AbstractFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from storage_test_helpers import Child

from lumos.storage import RunStorage
from lumos.storage.testing import S3Server, s3_server

BACKENDS = ["local", "memory", "s3"]


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@dataclass
class Location:
    """Where a test writes: a storage path plus the filesystem to use (None: infer from URL)."""

    backend: str
    storage_path: str
    filesystem: AbstractFileSystem | None

    def storage(self, name: str = "run") -> RunStorage:
        return RunStorage(self.storage_path, name, self.filesystem)

    def fresh_fs(self) -> AbstractFileSystem:
        """A filesystem with no shared cache, as another process would have."""
        if self.filesystem is None:
            return RunStorage(self.storage_path, "x").fs
        if self.backend == "s3":
            return type(self.filesystem)(**self.filesystem.storage_options)
        return self.filesystem


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    backend = request.param
    if backend == "local":
        yield Location("local", str(tmp_path / "runs"), None)
    elif backend == "memory":
        root = f"/lumos-test-{uuid.uuid4().hex}"
        yield Location("memory", f"memory://{root}", None)
        mem = MemoryFileSystem()
        if mem.exists(root):
            mem.rm(root, recursive=True)
    else:
        server: S3Server = request.getfixturevalue("s3")
        bucket = server.create_bucket()
        yield Location("s3", f"{bucket}/runs", server.filesystem())


@pytest.fixture
def make_local_dir(tmp_path: Path) -> Callable[..., Path]:
    """Create a local directory with the given {relpath: bytes} files."""
    counter = iter(range(10_000))

    def make(files: dict[str, bytes]) -> Path:
        root = tmp_path / f"local-{next(counter)}"
        for rel, data in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        root.mkdir(parents=True, exist_ok=True)
        return root

    return make


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child processes started by a test; killed at teardown if still running."""
    started: list[Child] = []
    yield started
    for child in started:
        child.cleanup()
