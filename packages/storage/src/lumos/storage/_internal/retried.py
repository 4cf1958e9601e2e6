"""The one place where lumos operates on a run's filesystem: every operation retried.

Every read, write, listing, copy and delete that ``lumos.train``, ``lumos.tune`` and the
``lumos`` command make on a run's filesystem calls one of these functions (published
as ``lumos.storage.retried_*`` and ``lumos.storage.AppendOnlyFile``); inside
``lumos.storage`` the same helpers live in ``filesystem.py``, over ``retry.py``.
``integration-tests/test_storage_paths.py`` fails on any storage call that bypasses them.

Each function is one whole idempotent operation run under the retry policy in force
(``get_retry_policy()``): a transient error (throttling, a connection reset, HTTP 5xx,
a timeout such as ``TimeoutError(ETIMEDOUT)``) repeats the whole operation after a
jittered back-off; a permanent error (permission denied, a missing bucket, a full
disk: ``ENOSPC``), or transient errors past the budget, raises ``StorageIOError``
naming the operation and the path. A missing path is not an error where the function
says so (``retried_read`` returns None, ``retried_ls`` an empty list, ...).
"""

from __future__ import annotations

import functools
import os
import posixpath
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu
from lumos.storage._internal.errors import StorageIOError
from lumos.storage._internal.retry import retry_call

_MISSING = (FileNotFoundError,)


def retried_write(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: readers see the old or the new content, never a mix.

    Local disk: a temporary file, fsynced, renamed over ``path``; object stores: one
    PUT of the whole object. A retry repeats the whole write.

    Raises:
        StorageIOError: A permanent error or transient errors past the retry budget;
            ``path`` then still holds its previous content (or nothing).
    """
    fsu.atomic_write_bytes(fs, path, bytes(data))


def retried_read(fs: AbstractFileSystem, path: str) -> bytes | None:
    """The content of file ``path``, or None when it does not exist.

    Raises:
        StorageIOError: A permanent error or transient errors past the retry budget.
    """
    return fsu.read_bytes(fs, path)


def retried_exists(fs: AbstractFileSystem, path: str) -> bool:
    """Whether ``path`` (a file or a directory) exists; cached listings are dropped first."""
    fsu.invalidate(fs, path)
    return bool(retry_call("list", path, functools.partial(fs.exists, path)))


def retried_isdir(fs: AbstractFileSystem, path: str) -> bool:
    """Whether ``path`` is a directory (on object stores: a prefix with objects under it)."""
    fsu.invalidate(fs, path)
    return bool(retry_call("list", path, functools.partial(fs.isdir, path)))


def retried_ls(fs: AbstractFileSystem, path: str, *, detail: bool = False) -> list[Any]:
    """The entries of directory ``path`` (names, or fsspec info dicts with ``detail``).

    A missing directory has no entries: ``[]``.
    """
    fsu.invalidate(fs, path)
    try:
        entries = retry_call(
            "list", path, functools.partial(fs.ls, path, detail=detail), passthrough=_MISSING
        )
    except FileNotFoundError:
        return []
    return list(entries)


def retried_child_dirs(fs: AbstractFileSystem, path: str) -> list[str]:
    """The names of the directories directly under ``path``, sorted (``[]`` when missing)."""
    names = {
        posixpath.basename(str(e["name"]).rstrip("/"))
        for e in retried_ls(fs, path, detail=True)
        if e.get("type") == "directory"
    }
    return sorted(n for n in names if n)


def retried_find(fs: AbstractFileSystem, path: str) -> list[str]:
    """Every file under ``path``, sorted (``[]`` when it does not exist)."""
    fsu.invalidate(fs, path)
    try:
        found = retry_call("list", path, functools.partial(fs.find, path), passthrough=_MISSING)
    except FileNotFoundError:
        return []
    return sorted(str(p) for p in found)


def retried_makedirs(fs: AbstractFileSystem, path: str) -> None:
    """Create directory ``path`` and its parents (nothing to do on object stores)."""
    retry_call("mkdir", path, functools.partial(fs.makedirs, path, exist_ok=True))


def retried_rm(fs: AbstractFileSystem, path: str, *, recursive: bool = False) -> bool:
    """Delete ``path`` (a directory and everything under it with ``recursive``).

    A retry deletes what is left, so a delete that failed part-way completes.

    Returns:
        Whether anything was there to delete (a missing path is not an error).
    """
    fsu.invalidate(fs, path)
    try:
        if not retry_call("list", path, functools.partial(fs.exists, path)):
            return False
        retry_call(
            "delete",
            path,
            functools.partial(fs.rm, path, recursive=recursive),
            passthrough=_MISSING,
        )
    except FileNotFoundError:
        pass  # gone already (an earlier attempt deleted the rest)
    finally:
        fsu.invalidate(fs, path)
    return True


def retried_copy_tree(fs: AbstractFileSystem, src: str, dest: str) -> list[str]:
    """Copy every file under ``src`` to the same relative path under ``dest`` on ``fs``.

    One retried copy per file (a copy is idempotent), so a retry or a rerun completes
    a copy that failed part-way. ``dest`` is not emptied first.

    Returns:
        The relative paths copied.

    Raises:
        FileNotFoundError: ``src`` does not exist, or a file vanished while copying
            (someone deletes ``src``: read what to copy again and retry).
        StorageIOError: A permanent error or transient errors past the retry budget.
    """
    src = src.rstrip("/")
    files = retried_find(fs, src)
    if not files and not retried_exists(fs, src):
        raise FileNotFoundError(src)
    base = _strip(fs, src)
    retried_makedirs(fs, dest)
    copied: list[str] = []
    made = {dest}
    for path in files:
        rel = posixpath.relpath(_strip(fs, path), base)
        target = fsu.join(dest, rel)
        parent = posixpath.dirname(target)
        if parent not in made:
            retried_makedirs(fs, parent)
            made.add(parent)
        retry_call("copy", path, functools.partial(fs.cp_file, path, target), passthrough=_MISSING)
        copied.append(rel)
    fsu.invalidate(fs, dest)
    return copied


def retried_put_file(fs: AbstractFileSystem, local_path: str, path: str) -> None:
    """Upload local file ``local_path`` to ``path`` on ``fs`` (a retry uploads it again)."""
    retry_call("upload", path, functools.partial(fs.put_file, local_path, path))
    fsu.invalidate(fs, path)


def retried_download(fs: AbstractFileSystem, path: str, local_dir: str) -> None:
    """Copy every file under directory ``path`` on ``fs`` into local ``local_dir``.

    Raises:
        FileNotFoundError: ``path`` is not a directory on ``fs``.
        StorageIOError: A permanent error or transient errors past the retry budget.
    """
    fsu.download_dir(fs, path, local_dir)


def _strip(fs: AbstractFileSystem, path: str) -> str:
    stripped = fs._strip_protocol(path)
    return (stripped if isinstance(stripped, str) else str(stripped)).rstrip("/")


class AppendOnlyFile:
    """A local file that only grows, whose appends are retried without duplicating data.

    Each :meth:`append` writes one whole chunk at the end (``O_APPEND``). The end of the
    last complete append is remembered: an attempt that failed part-way (a short write,
    ``EIO``) is cut off (``ftruncate``) before the next attempt writes the chunk again,
    so a retried append lands exactly once; an append that fails for good is cut off
    too, leaving the file as the last complete append left it. One writer at a time
    (the process holding the run's lease). The file is opened on first use.

    Args:
        path: The local file (its directory is created on first use).

    Example:
        >>> log = AppendOnlyFile("/tmp/lumos-doc/events.jsonl")  # doctest: +SKIP
        >>> log.append(b'{"e": 1}\\n')                            # doctest: +SKIP
        >>> log.close()                                          # doctest: +SKIP
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._end: int | None = None
        self._torn = False

    @property
    def size(self) -> int | None:
        """Bytes in the file after the last complete append (None until first used)."""
        return self._end

    def _open(self) -> int:
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if self._end is None:
                self._end = os.fstat(fd).st_size
            self._fd = fd
        if self._torn:  # an earlier attempt wrote part of its chunk: cut it off
            os.ftruncate(self._fd, self._end or 0)
            self._torn = False
        return self._fd

    def _append_once(self, data: bytes) -> None:
        try:
            fd = self._open()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            self._torn = True
            self._drop_fd()  # the next attempt opens the file again
            raise
        self._end = (self._end or 0) + len(data)

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end of the file, whole and once.

        Raises:
            StorageIOError: A permanent error (a full disk: ``ENOSPC``) or transient
                errors past the retry budget; the file then ends where it ended before.
        """
        try:
            retry_call("append", self.path, functools.partial(self._append_once, bytes(data)))
        except StorageIOError:
            self._cut_torn_tail()
            raise

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (a torn tail left by a killed writer)."""

        def cut() -> None:
            self._drop_fd()
            os.truncate(self.path, size)
            self._end = size
            self._torn = False

        retry_call("truncate", self.path, cut)

    def sync(self) -> None:
        """``fsync`` what was appended (nothing to do before the first append)."""
        if self._fd is not None:
            fd = self._fd
            retry_call("sync", self.path, functools.partial(os.fsync, fd))

    def close(self) -> None:
        """``fsync`` and close (the file can be appended to again: it reopens)."""
        try:
            self.sync()
        finally:
            self._drop_fd()

    def _cut_torn_tail(self) -> None:
        if not self._torn or self._end is None:
            return
        try:
            os.truncate(self.path, self._end)
            self._torn = False
        except OSError:  # best effort: the next append (or a reader's repair) cuts it
            pass

    def _drop_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
