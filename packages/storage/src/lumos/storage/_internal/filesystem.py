"""fsspec helpers: resolving URLs, joining paths, atomic writes, concurrent copies."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from lumos.storage._internal.errors import MissingBackendError
from lumos.storage._internal.retry import retry_call

# Extras of lumos-storage that install a protocol's backend.
_EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}

DEFAULT_MAX_WORKERS = 16
"""Threads of a concurrent upload or download."""

LOCAL_MAX_WORKERS = 4
"""At most this many threads copy on local disk."""


def _protocol_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def resolve_filesystem(
    path_or_url: str | os.PathLike[str], filesystem: AbstractFileSystem | None = None
) -> tuple[AbstractFileSystem, str]:
    """Return the filesystem and its native path for a path or fsspec URL.

    Args:
        path_or_url: A local path (``~`` is expanded, relative paths become
            absolute) or an fsspec URL such as ``s3://bucket/runs`` or ``memory://runs``.
        filesystem: Use this filesystem instead of inferring one from the URL
            (for example an ``s3fs.S3FileSystem`` with a custom endpoint).

    Returns:
        ``(filesystem, path)`` where ``path`` is in the filesystem's own form
        (``bucket/runs`` for S3, an absolute path for local disk).

    Raises:
        MissingBackendError: The package that implements the URL's protocol is
            not installed; the message says what to install.

    Example:
        >>> fs, path = resolve_filesystem("memory://runs/a")
        >>> path
        '/runs/a'
    """
    raw = os.fspath(path_or_url)
    if not isinstance(raw, str):
        raise TypeError(f"storage path must be str or os.PathLike[str], got {type(raw).__name__}")
    if filesystem is not None:
        if isinstance(filesystem, LocalFileSystem) and "://" not in raw:
            raw = os.path.expanduser(raw)
        return filesystem, _strip(filesystem, raw)
    if "://" not in raw and "::" not in raw:
        local = os.path.abspath(os.path.expanduser(raw))
        return LocalFileSystem(), local
    protocol = _protocol_of(raw)
    try:
        fs, path = fsspec.core.url_to_fs(raw)
    except (ImportError, ValueError) as exc:
        if isinstance(exc, ValueError) and "Protocol not known" not in str(exc):
            raise
        package, extra = _EXTRAS.get(protocol, (f"the fsspec backend for {protocol!r}", ""))
        hint = (
            f"pip install 'lumos-storage[{extra}]'"
            if extra
            else "see https://filesystem-spec.readthedocs.io/en/latest/api.html#other-known-implementations"
        )
        raise MissingBackendError(
            protocol,
            f"Cannot open {raw!r}: install {package} to access {protocol}:// URLs: {hint} "
            f"(fsspec said: {exc})",
        ) from exc
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(os.path.expanduser(path))
    return fs, path


def _strip(fs: AbstractFileSystem, path: str) -> str:
    stripped = fs._strip_protocol(path)
    return stripped if isinstance(stripped, str) else str(stripped)


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local disk."""
    return isinstance(fs, LocalFileSystem)


def join(base: str, *parts: str) -> str:
    """Join fs-native path components with ``/``."""
    out = base.rstrip("/") if base not in ("/", "") else base
    for part in parts:
        part = part.strip("/")
        if not part:
            continue
        out = f"{out}/{part}" if out not in ("", "/") else f"{out}{part}"
    return out


def to_uri(fs: AbstractFileSystem, path: str) -> str:
    """A URL for ``path`` that ``resolve_filesystem`` turns back into the same location."""
    if is_local(fs):
        return path
    uri = fs.unstrip_protocol(path)
    return uri if isinstance(uri, str) else str(uri)


def invalidate(fs: AbstractFileSystem, path: str | None = None) -> None:
    """Drop cached listings (s3fs caches directory listings)."""
    try:
        fs.invalidate_cache(path)
    except Exception:  # pragma: no cover - backends without a cache
        pass


def atomic_write_bytes(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix.

    Local disk: a temporary file in the same directory, flushed and fsynced,
    then ``os.replace`` and an fsync of the directory. Object stores: one put
    of the whole object, which is atomic there. Transient errors retry the whole
    write (a new temporary file, or the same put again).

    Raises:
        StorageIOError: A permanent error or transient errors past the retry budget;
            ``path`` then still holds its previous content (or nothing).
    """
    if is_local(fs):
        retry_call("write", path, functools.partial(_local_atomic_write, path, data))
    else:
        retry_call("write", path, functools.partial(fs.pipe_file, path, data))
        invalidate(fs, path)


_TEMP_MARK = ".tmp-"


def remove_temp_files(folder: str) -> None:
    """Delete the temporary files that local atomic writes killed mid-write left under
    the local ``folder`` (nothing when it does not exist)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            if name.startswith(".") and _TEMP_MARK in name:
                tmp = os.path.join(root, name)
                with contextlib.suppress(FileNotFoundError):
                    call("delete", tmp, os.unlink, tmp)


def _local_atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}{_TEMP_MARK}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def read_bytes(fs: AbstractFileSystem, path: str) -> bytes | None:
    """The content of ``path`` or None when it does not exist (transient errors retried)."""
    read: Callable[[], Any] = (
        functools.partial(_read_local, path)
        if is_local(fs)
        else functools.partial(fs.cat_file, path)
    )
    try:
        data = retry_call("read", path, read, passthrough=(FileNotFoundError,))
    except FileNotFoundError:
        return None
    return bytes(data)


def call(operation: str, path: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with transient errors retried (see ``retry_call``).

    ``FileNotFoundError`` passes through unchanged for the caller to handle.
    """
    return retry_call(
        operation,
        path,
        functools.partial(fn, *args, **kwargs),
        passthrough=(FileNotFoundError,),
    )


def local_files(local_dir: str) -> list[str]:
    """Relative POSIX paths of every file under ``local_dir`` (symlinks followed)."""
    out: list[str] = []
    for root, _dirs, files in os.walk(local_dir, followlinks=True):
        rel_root = os.path.relpath(root, local_dir)
        for name in files:
            rel = name if rel_root == "." else os.path.join(rel_root, name)
            out.append(rel.replace(os.sep, "/"))
    out.sort()
    return out


def run_parallel(
    tasks: Iterable[Callable[[], Any]], max_workers: int = DEFAULT_MAX_WORKERS
) -> None:
    """Run callables in a thread pool; re-raise the first error after all have stopped."""
    task_list = list(tasks)
    if not task_list:
        return
    if len(task_list) == 1 or max_workers <= 1:
        for task in task_list:
            task()
        return
    with ThreadPoolExecutor(max_workers=min(max_workers, len(task_list))) as pool:
        futures = [pool.submit(task) for task in task_list]
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err


def _copy_all(copy_one: Callable[[str], None], rels: list[str]) -> None:
    for rel in rels:
        copy_one(rel)


def balanced_bins(items: list[str], sizes: dict[str, int], num_bins: int) -> list[list[str]]:
    """Split ``items`` into at most ``num_bins`` lists of similar total size (largest first)."""
    num_bins = max(1, min(num_bins, len(items)))
    bins: list[list[str]] = [[] for _ in range(num_bins)]
    totals = [0] * num_bins
    for item in sorted(items, key=lambda i: -sizes[i]):
        k = totals.index(min(totals))
        bins[k].append(item)
        totals[k] += sizes[item] + 64 * 1024  # per-file cost, so many tiny files spread too
    return [b for b in bins if b]


def _copy_durably(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` and fsync it: on disk when this returns, power loss included."""
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})
"""``os.link`` errors after which a file is copied instead (another filesystem, none allowed)."""


def _link_durably(src: str, dst: str) -> None:
    """Hard-link ``src`` as ``dst`` (a copy where linking is impossible), then fsync it.

    A second link of the same inode costs no copy and no second write: fsync writes only
    what is not on disk yet. A ``src`` that has another name already (a link the caller
    does not own, which could be rewritten later) is copied. Repeatable: a ``dst`` left
    by an earlier try is replaced.
    """
    if os.stat(src).st_nlink > 1 and not (os.path.exists(dst) and os.path.samefile(src, dst)):
        _copy_durably(src, dst)
        return
    try:
        os.link(src, dst)
    except FileExistsError:
        if not os.path.samefile(src, dst):
            os.unlink(dst)
            os.link(src, dst)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        _copy_durably(src, dst)
        return
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_local_dirs(dest: str, rels: list[str]) -> list[str]:
    """Create ``dest`` and the folders of ``rels`` in it; return the folders whose entries
    change (each new folder and the one holding ``dest``), deepest first."""
    subdirs = sorted({os.path.dirname(r) for r in rels} - {""})
    os.makedirs(dest, exist_ok=True)
    for d in subdirs:
        os.makedirs(os.path.join(dest, d), exist_ok=True)
    made = [os.path.join(dest, d) for d in subdirs] + [dest, os.path.dirname(dest)]
    return sorted(set(made), key=lambda p: -p.count(os.sep))


def upload_dir(
    local_dir: str,
    fs: AbstractFileSystem,
    dest: str,
    max_workers: int = DEFAULT_MAX_WORKERS,
    on_file_done: Callable[[str], None] | None = None,
    link: bool = False,
) -> list[str]:
    """Copy every file of ``local_dir`` to ``dest`` on ``fs`` concurrently.

    Local to local uses ``shutil.copyfile`` (``copy_file_range``/``sendfile``
    under the hood) in threads and fsyncs each file in the thread that copied it,
    then the folders it created (and the one holding ``dest``): once this returns
    the files are on disk, as the run state that will name them is. With ``link``
    (the caller deletes ``local_dir`` afterwards and never rewrites its files) each
    file is hard-linked instead where both sides share a filesystem. Other backends
    use ``fs.put_file`` in threads (an object is durable once its put returned).
    Returns the relative paths copied.
    """
    rels = local_files(local_dir)
    local = is_local(fs)
    place = _link_durably if link else _copy_durably
    if local:
        made = _make_local_dirs(dest, rels)
    else:
        retry_call("mkdir", dest, functools.partial(fs.makedirs, dest, exist_ok=True))

    def copy_one(rel: str) -> None:
        # One file = one idempotent operation: a retry copies (puts) the whole file again.
        src = os.path.join(local_dir, rel)
        dst = join(dest, rel)
        if local:
            if os.path.abspath(src) != os.path.abspath(dst):
                retry_call("upload", dst, functools.partial(place, src, dst))
        else:
            retry_call("upload", dst, functools.partial(fs.put_file, src, dst))
        if on_file_done is not None:
            on_file_done(rel)

    sizes = {r: os.path.getsize(os.path.join(local_dir, r)) for r in rels}
    if local:
        # Local disk: a few threads, each copying a balanced bin of files with
        # copyfile (copy_file_range/sendfile, GIL released). Bins instead of one
        # task per file keep the per-file Python overhead at a plain copy's level.
        bins = balanced_bins(rels, sizes, min(max_workers, LOCAL_MAX_WORKERS))
        run_parallel([functools.partial(_copy_all, copy_one, b) for b in bins], len(bins))
        for directory in made:  # the files' names are durable too, deepest first
            _fsync_dir(directory)
    else:
        # Remote: latency-bound, one task per file, big files first.
        ordered = sorted(rels, key=lambda r: -sizes[r])
        run_parallel([functools.partial(copy_one, r) for r in ordered], max_workers)
        invalidate(fs, dest)
    return rels


def download_dir(
    fs: AbstractFileSystem, src: str, local_dir: str, max_workers: int = DEFAULT_MAX_WORKERS
) -> None:
    """Copy every file under ``src`` on ``fs`` into ``local_dir`` concurrently."""
    os.makedirs(local_dir, exist_ok=True)
    invalidate(fs, src)
    if is_local(fs):
        if os.path.abspath(src) == os.path.abspath(local_dir):
            return
        pairs = [(os.path.join(src, r), os.path.join(local_dir, r)) for r in local_files(src)]
        if not os.path.isdir(src):
            raise FileNotFoundError(src)
    else:
        if not call("list", src, fs.isdir, src):
            raise FileNotFoundError(src)
        prefix = src.rstrip("/") + "/"
        pairs = []
        for remote in sorted(call("list", src, fs.find, src, detail=False)):
            rel = remote[len(prefix) :] if remote.startswith(prefix) else os.path.basename(remote)
            pairs.append((remote, os.path.join(local_dir, *rel.split("/"))))
    for d in sorted({os.path.dirname(p[1]) for p in pairs}):
        os.makedirs(d, exist_ok=True)

    def fetch(remote: str, local_path: str) -> None:
        if is_local(fs):
            call("download", remote, shutil.copyfile, remote, local_path)
        else:
            call("download", remote, fs.get_file, remote, local_path)

    run_parallel([functools.partial(fetch, *p) for p in pairs], max_workers)
