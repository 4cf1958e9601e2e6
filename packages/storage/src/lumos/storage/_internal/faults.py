"""FaultyFileSystem: an fsspec wrapper that fails a seeded fraction of operations.

Exported by ``lumos.storage.testing``; see ``FaultyFileSystem`` for the controls. This
module is the fsspec side (which calls count as which kind, the delegation);
``fault_schedule.py`` decides which calls fail.
"""

from __future__ import annotations

import collections
import os
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from lumos.storage._internal.fault_schedule import FaultSchedule


class FaultyFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """An fsspec filesystem that delegates to ``fs`` and fails a seeded fraction of its calls.

    Each call of a faulted kind draws from a ``random.Random(seed)``; with probability
    ``<kind>_failure_rate`` it raises before reaching ``fs`` (the request "failed on the
    wire", nothing was written). Transient faults are the errors a network store raises
    for throttling, connection resets and timeouts, which lumos-storage retries:
    ``ConnectionResetError(ECONNRESET)``, ``TimeoutError(ETIMEDOUT)`` and
    ``OSError(EBUSY, "SlowDown ...")`` (what s3fs raises for HTTP 503). With
    ``permanent=True`` every fault is a ``PermissionError(EACCES)`` instead, which is
    never retried.

    Kinds and the calls they cover:

    * ``write``: ``open`` for writing, ``pipe_file``, ``put_file``, ``touch``;
    * ``rename``: ``mv``/``rename``, ``copy``, ``cp_file``;
    * ``list``: ``ls``, ``find``, ``glob``, ``info``, ``exists``, ``isdir``, ``isfile``;
    * ``read``: ``open`` for reading, ``cat_file``, ``get_file``;
    * ``delete``: ``rm``, ``rm_file``.

    Other calls (``makedirs``, ``invalidate_cache``, ...) pass through. On a local inner
    filesystem ``pipe_file`` writes a temporary file and renames it, as lumos-storage
    does on local disk, so a process killed mid-write leaves no truncated file, and
    writes and copies create missing parent directories, as object stores do.

    Controls, later ones overriding earlier ones:

    1. the constructor's arguments (pickled with the filesystem, so Ray workers that
       receive it in ``RunConfig(storage_filesystem=...)`` inject at the same rates;
       each process draws from its own ``Random(seed)``);
    2. the environment variable ``LUMOS_STORAGE_FAULTS``: a JSON object with any of
       ``enabled``, ``permanent``, ``<kind>_failure_rate``, ``max_consecutive``, read
       when an instance is created (``'{"enabled": false}'`` switches faults off);
    3. a control file (``control_file=`` or the ``LUMOS_STORAGE_FAULTS_FILE``
       environment variable): the same JSON object, re-read whenever its modification
       time changes, so a harness can switch faults on and off in worker processes it
       does not control (write it atomically: temp file + ``os.replace``). A missing or
       unreadable file leaves the other settings in force;
    4. ``set_faults(...)`` in this process.

    Counters: ``injected`` (faults by kind in this process), ``calls`` (faulted-kind
    calls by kind). With ``record_dir`` each process also appends one JSON line per
    fault to ``record_dir/faults-<host>-<pid>.jsonl``; ``read_fault_records(record_dir)``
    sums them over every process.

    Args:
        fs: The filesystem to wrap (local, memory, s3fs, ...).
        seed: Seed of the fault draws.
        write_failure_rate: Fraction of writes that fail.
        rename_failure_rate: Fraction of renames, moves and copies that fail.
        list_failure_rate: Fraction of listings and metadata lookups that fail.
        read_failure_rate: Fraction of reads that fail.
        delete_failure_rate: Fraction of deletes that fail.
        permanent: Raise ``PermissionError`` instead of transient errors.
        enabled: Whether faults are injected at all.
        max_consecutive: After this many faults in a row on the same kind and path the
            next call passes (``None``: no limit). Set it below the retry policy's
            attempts to have every operation eventually succeed.
        control_file: Path of a JSON control file on the local disk (see above).
        record_dir: Local directory for per-process fault records (see above).

    Raises:
        ValueError: A rate is outside ``[0, 1]`` or ``max_consecutive`` is below 1.

    Example:
        >>> from fsspec.implementations.memory import MemoryFileSystem
        >>> faulty = FaultyFileSystem(MemoryFileSystem(), write_failure_rate=1.0, permanent=True)
        >>> faulty.pipe_file("/x", b"1")
        Traceback (most recent call last):
        ...
        PermissionError: [Errno 13] injected permanent write fault on '/x'
        >>> faulty.set_faults(enabled=False)
        >>> faulty.pipe_file("/x", b"1")
        >>> faulty.injected["write"]
        1
    """

    cachable = False
    protocol = "faulty"

    def __init__(
        self,
        fs: AbstractFileSystem,
        seed: int = 0,
        write_failure_rate: float = 0.0,
        rename_failure_rate: float = 0.0,
        list_failure_rate: float = 0.0,
        read_failure_rate: float = 0.0,
        delete_failure_rate: float = 0.0,
        permanent: bool = False,
        enabled: bool = True,
        max_consecutive: int | None = None,
        control_file: str | None = None,
        record_dir: str | None = None,
    ) -> None:
        super().__init__(
            fs,
            seed=seed,
            write_failure_rate=write_failure_rate,
            rename_failure_rate=rename_failure_rate,
            list_failure_rate=list_failure_rate,
            read_failure_rate=read_failure_rate,
            delete_failure_rate=delete_failure_rate,
            permanent=permanent,
            enabled=enabled,
            max_consecutive=max_consecutive,
            control_file=control_file,
            record_dir=record_dir,
        )
        if not isinstance(fs, AbstractFileSystem):
            raise TypeError(f"fs must be an fsspec AbstractFileSystem, got {type(fs).__name__}")
        self.fs = fs
        self.seed = seed
        self.record_dir = record_dir
        self._schedule = FaultSchedule(
            seed,
            {
                "enabled": enabled,
                "permanent": permanent,
                "write_failure_rate": write_failure_rate,
                "rename_failure_rate": rename_failure_rate,
                "list_failure_rate": list_failure_rate,
                "read_failure_rate": read_failure_rate,
                "delete_failure_rate": delete_failure_rate,
                "max_consecutive": max_consecutive,
            },
            control_file,
            record_dir,
        )
        self.control_file = self._schedule.control_file

    # -- controls -------------------------------------------------------------
    def set_faults(self, **settings: Any) -> None:
        """Change settings in this process (``enabled``, ``permanent``, rates, ``max_consecutive``).

        They override the constructor, the environment and the control file until
        ``clear_overrides()``.
        """
        self._schedule.set_faults(**settings)

    def clear_overrides(self) -> None:
        """Forget what ``set_faults`` changed."""
        self._schedule.clear_overrides()

    def reset_counts(self) -> None:
        """Zero ``injected`` and ``calls``."""
        self._schedule.reset_counts()

    @property
    def settings(self) -> dict[str, Any]:
        """The settings in force now (after the control file is checked)."""
        return self._schedule.settings

    @property
    def injected(self) -> collections.Counter[str]:
        """Faults injected by kind in this process."""
        return self._schedule.injected

    @property
    def calls(self) -> collections.Counter[str]:
        """Calls of a faulted kind, by kind, in this process."""
        return self._schedule.calls

    # -- path forms -----------------------------------------------------------
    def _strip_protocol(self, path: Any) -> Any:
        return self.fs._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        """The inner filesystem's URL for ``name``."""
        return str(self.fs.unstrip_protocol(name))

    @property
    def wrapped_filesystem(self) -> AbstractFileSystem:
        """The filesystem this one delegates to."""
        return self.fs

    @property
    def fsid(self) -> str:
        """Same id as the inner filesystem."""
        return str(self.fs.fsid)

    def _local_parent(self, path: str) -> None:
        """On local disk, create the parent directory (object stores have none to create)."""
        if isinstance(self.fs, LocalFileSystem):
            parent = os.path.dirname(self.fs._strip_protocol(path))
            if parent:
                os.makedirs(parent, exist_ok=True)

    # -- delegated calls ------------------------------------------------------
    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Any = None,
        autocommit: bool = True,
        cache_options: Any = None,
        **kwargs: Any,
    ) -> Any:
        writing = any(c in mode for c in "wax+")
        self._schedule.maybe_fail("write" if writing else "read", path)
        if writing:
            self._local_parent(path)
        return self.fs.open(
            path,
            mode=mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_options=cache_options,
            **kwargs,
        )

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        """Write ``value`` to ``path`` (a write fault may be injected first)."""
        self._schedule.maybe_fail("write", path)
        if isinstance(self.fs, LocalFileSystem) and mode == "overwrite" and not kwargs:
            from lumos.storage._internal.filesystem import atomic_write_bytes

            atomic_write_bytes(self.fs, self.fs._strip_protocol(path), bytes(value))
            return None
        return self.fs.pipe_file(path, value, mode=mode, **kwargs)

    def put_file(self, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
        """Upload a local file (a write fault may be injected first)."""
        self._schedule.maybe_fail("write", rpath)
        self._local_parent(rpath)
        return self.fs.put_file(lpath, rpath, *args, **kwargs)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> Any:
        """Create or truncate ``path`` (a write fault may be injected first)."""
        self._schedule.maybe_fail("write", path)
        return self.fs.touch(path, truncate=truncate, **kwargs)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> Any:
        """Read ``path`` (a read fault may be injected first)."""
        self._schedule.maybe_fail("read", path)
        return self.fs.cat_file(path, start=start, end=end, **kwargs)

    def get_file(self, rpath: str, lpath: str, *args: Any, **kwargs: Any) -> Any:
        """Download ``rpath`` (a read fault may be injected first)."""
        self._schedule.maybe_fail("read", rpath)
        return self.fs.get_file(rpath, lpath, *args, **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        """List ``path`` (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return self.fs.ls(path, detail=detail, **kwargs)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Every file under ``path`` (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return self.fs.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        """Paths matching ``path`` (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return self.fs.glob(path, maxdepth=maxdepth, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        """Metadata of ``path`` (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return self.fs.info(path, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Whether ``path`` exists (a list fault may be injected first, and is raised)."""
        self._schedule.maybe_fail("list", path)
        return bool(self.fs.exists(path, **kwargs))

    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return bool(self.fs.isdir(path))

    def isfile(self, path: str) -> bool:
        """Whether ``path`` is a file (a list fault may be injected first)."""
        self._schedule.maybe_fail("list", path)
        return bool(self.fs.isfile(path))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> Any:
        """Copy one file (a rename fault may be injected first)."""
        self._schedule.maybe_fail("rename", path1)
        self._local_parent(path2)
        return self.fs.cp_file(path1, path2, **kwargs)

    def copy(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> Any:
        """Copy files (a rename fault may be injected first)."""
        self._schedule.maybe_fail("rename", path1)
        if isinstance(path2, str):
            self._local_parent(path2)
        return self.fs.copy(path1, path2, *args, **kwargs)

    def mv(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> Any:
        """Move files (a rename fault may be injected first)."""
        self._schedule.maybe_fail("rename", path1)
        return self.fs.mv(path1, path2, *args, **kwargs)

    def rm_file(self, path: str) -> Any:
        """Delete one file (a delete fault may be injected first)."""
        self._schedule.maybe_fail("delete", path)
        return self.fs.rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> Any:
        """Delete files (a delete fault may be injected first)."""
        self._schedule.maybe_fail("delete", path)
        return self.fs.rm(path, recursive=recursive, maxdepth=maxdepth)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> Any:
        """Create a directory (never faulted)."""
        return self.fs.mkdir(path, create_parents=create_parents, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> Any:
        """Create a directory and its parents (never faulted)."""
        return self.fs.makedirs(path, exist_ok=exist_ok)

    def rmdir(self, path: str) -> Any:
        """Remove an empty directory (never faulted)."""
        return self.fs.rmdir(path)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Drop the inner filesystem's cached listings."""
        self.fs.invalidate_cache(path)

    def created(self, path: str) -> Any:
        """Creation time from the inner filesystem."""
        return self.fs.created(path)

    def modified(self, path: str) -> Any:
        """Modification time from the inner filesystem."""
        return self.fs.modified(path)

    def __getattr__(self, name: str) -> Any:
        # Backend-specific calls (s3fs's ``call_s3``, ``split_path``, ...) pass
        # through unfaulted. Only reached for names the class does not define.
        if name.startswith("__") or name in ("fs", "_schedule"):
            raise AttributeError(name)
        return getattr(self.fs, name)

    def __repr__(self) -> str:
        settings = self._schedule.last_settings
        return f"FaultyFileSystem({self.fs!r}, seed={self.seed}, settings={settings})"
