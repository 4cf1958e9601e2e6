"""Checkpoint: a directory on any fsspec filesystem."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu

METADATA_FILE = ".metadata.json"
"""File inside a checkpoint directory that holds its metadata."""


class Checkpoint:
    """A directory of files on local disk, in memory, on S3 or any fsspec filesystem.

    Checkpoints pickle (path and filesystem) so they can travel between processes.

    Args:
        path: A local path (``~`` expanded) or an fsspec URL (``s3://bucket/run/ckpt``).
        filesystem: An explicit fsspec filesystem; ``path`` is then in its form.

    Example:
        >>> ckpt = Checkpoint.from_directory("/tmp/model")          # doctest: +SKIP
        >>> with ckpt.as_directory() as d:                          # doctest: +SKIP
        ...     state = torch.load(os.path.join(d, "model.pt"))
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: AbstractFileSystem | None = None):
        self._fs, self._path = fsu.resolve_filesystem(path, filesystem)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint for an existing directory (local path or fsspec URL)."""
        return cls(path)

    @property
    def path(self) -> str:
        """The directory in the filesystem's own form (``bucket/key`` for S3)."""
        return self._path

    @property
    def filesystem(self) -> AbstractFileSystem:
        """The fsspec filesystem holding the directory."""
        return self._fs

    @property
    def uri(self) -> str:
        """A URL for the directory (a plain path on local disk)."""
        return fsu.to_uri(self._fs, self._path)

    def is_local(self) -> bool:
        """Whether the checkpoint is on the local disk."""
        return fsu.is_local(self._fs)

    def to_directory(self, dest: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint's files into a local directory and return its path.

        Args:
            dest: Target directory (created if needed); a new temporary
                directory when None.

        Returns:
            The local directory.
        """
        target = (
            tempfile.mkdtemp(prefix="lumos-checkpoint-")
            if dest is None
            else os.path.abspath(os.path.expanduser(os.fspath(dest)))
        )
        fsu.download_dir(self._fs, self._path, target)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """Yield a local directory with the checkpoint's files.

        No copy is made when the checkpoint is already on local disk; otherwise
        the files are downloaded into a temporary directory removed afterwards.
        Treat the directory as read-only.
        """
        if self.is_local():
            yield self._path
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _metadata_path(self) -> str:
        return fsu.join(self._path, METADATA_FILE)

    def get_metadata(self) -> dict[str, Any]:
        """The metadata stored with the checkpoint (``{}`` when none)."""
        fsu.invalidate(self._fs, self._path)
        data = fsu.read_bytes(self._fs, self._metadata_path())
        if data is None:
            return {}
        loaded = json.loads(data)
        return dict(loaded) if isinstance(loaded, dict) else {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata (JSON-serializable dict), written atomically."""
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        payload = json.dumps(metadata, sort_keys=True).encode()
        fsu.atomic_write_bytes(self._fs, self._metadata_path(), payload)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the stored metadata."""
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __getstate__(self) -> dict[str, Any]:
        return {"fs": self._fs, "path": self._path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._fs = state["fs"]
        self._path = state["path"]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        if self._path != other._path:
            return False
        # fsspec tokens can differ for equal filesystems (e.g. skip_instance_cache).
        return bool(self._fs == other._fs) or (
            type(self._fs) is type(other._fs)
            and self._fs.storage_options == other._fs.storage_options
        )

    def __hash__(self) -> int:
        return hash((self._path, type(self._fs).__name__))

    def __repr__(self) -> str:
        return f"Checkpoint(uri={self.uri!r})"
