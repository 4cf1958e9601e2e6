"""The read side of the ``lumos`` command: find stored runs, summarize one, describe one.

Read-only: nothing here writes, so it is safe on a run whose driver is still running.
Every summary and description is a JSON-able dict (what ``--json`` prints); the
tables of ``lumos.storage.cli`` are rendered from the same dicts.
"""

from __future__ import annotations

import datetime
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu
from lumos.storage._internal.errors import StorageError, StorageUsageError
from lumos.storage._internal.retried import retried_child_dirs, retried_exists
from lumos.storage._internal.run_index import (
    KNOWN_OWNERS as KNOWN_OWNERS,
    is_number as is_number,
    latest_best,
    owner_of,
)
from lumos.storage._internal.run_storage import STATE_DIR, STATE_FILE, RunStorage
from lumos.storage._internal.state import CheckpointRecord, RunState

_S3_PROTOCOLS = ("s3", "s3a")
_LOOKUPS = 16  # run states looked for at once under a storage path


class NotARunError(StorageError, ValueError):
    """A path given to the ``lumos`` command holds no lumos run (the command exits with 2)."""


@dataclass(frozen=True)
class StoredRun:
    """A run (or a Tune experiment) as found in storage.

    Attributes:
        storage: Its storage (``storage.uri`` is the path to show).
        state: Its run state, as read.
    """

    storage: RunStorage
    state: RunState

    @property
    def owner(self) -> str | None:
        """The key of ``state.extra`` naming the package that wrote it (``"tune"``), if any."""
        return owner_of(self.state)


def open_location(path: str, endpoint_url: str | None = None) -> tuple[AbstractFileSystem, str]:
    """The filesystem and native path of a local path or URL the user typed.

    Remote filesystems are opened without fsspec's instance cache, so every command
    sees the storage as it is now. ``endpoint_url`` (S3 only) points s3fs at an
    S3-compatible server; without it, s3fs and botocore read the standard AWS
    settings (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws/config``, ...).

    Raises:
        StorageUsageError: ``endpoint_url`` with a path that is not ``s3://``.
        MissingBackendError: The URL's fsspec backend is not installed.
    """
    protocol = path.split("://", 1)[0] if "://" in path else "file"
    if endpoint_url is not None and protocol not in _S3_PROTOCOLS:
        raise StorageUsageError(
            f"--endpoint-url={endpoint_url!r} applies to s3:// paths only, not to {path!r}"
        )
    if protocol == "file" and "::" not in path:
        return fsu.resolve_filesystem(path)
    options: dict[str, Any] = {"skip_instance_cache": True}
    if endpoint_url is not None:
        options["client_kwargs"] = {"endpoint_url": endpoint_url}
    try:
        fs, _ = fsspec.core.url_to_fs(path, **options)
    except (ImportError, ValueError):
        return fsu.resolve_filesystem(path)  # raises the error that names the extra
    return fsu.resolve_filesystem(path, fs)


def _state_file(fs: AbstractFileSystem, run_path: str) -> str:
    return fsu.join(run_path, STATE_DIR, STATE_FILE)


def _has_state(fs: AbstractFileSystem, run_path: str) -> bool:
    fsu.invalidate(fs, fsu.join(run_path, STATE_DIR))
    try:
        return retried_exists(fs, _state_file(fs, run_path))
    except OSError:  # StorageIOError included: unreadable counts as no run here
        return False


def _child_dirs(fs: AbstractFileSystem, path: str) -> list[str]:
    return [n for n in retried_child_dirs(fs, path) if n != STATE_DIR]


def _load(fs: AbstractFileSystem, run_path: str) -> StoredRun:
    parent, name = posixpath.split(run_path.rstrip("/"))
    storage = RunStorage(parent or "/", name, fs)
    state = storage.load_state()
    if state is None:  # removed between the listing and the read
        raise NotARunError(f"{storage.uri!r} is not a lumos run: its run state is gone")
    return StoredRun(storage, state)


def open_run(path: str, endpoint_url: str | None = None) -> StoredRun:
    """The run (or experiment) stored at ``path`` (``{storage_path}/{name}``).

    Raises:
        NotARunError: ``path`` has no ``_lumos/run_state.json``.
        RunStateError: The run state is corrupt or from a newer lumos-storage.
    """
    fs, native = open_location(path, endpoint_url)
    if not _has_state(fs, native):
        hint = ""
        children = [n for n in _child_dirs(fs, native) if _has_state(fs, fsu.join(native, n))]
        if children:
            hint = f"; it holds runs: {', '.join(children[:5])} (see `lumos ls {path}`)"
        raise NotARunError(
            f"{path!r} is not a lumos run or sweep: expected its run state at "
            f"{fsu.to_uri(fs, _state_file(fs, native))!r}{hint}"
        )
    return _load(fs, native)


def find_runs(path: str, endpoint_url: str | None = None) -> tuple[AbstractFileSystem, list[str]]:
    """The runs and experiments under ``path``: ``path`` itself when it is one, else
    its direct subdirectories that are (by name). Nested runs (Tune trials, a Train run
    inside a trial) are not listed: ``lumos show`` shows them.

    Returns:
        ``(filesystem, run_paths)``; :func:`load_run` reads each.

    Raises:
        NotARunError: ``path`` does not exist.
    """
    fs, native = open_location(path, endpoint_url)
    return fs, find_runs_in(fs, native, path)


def find_runs_in(fs: AbstractFileSystem, native: str, shown: str | None = None) -> list[str]:
    """:func:`find_runs` on an open filesystem: ``native`` itself, or its child runs.

    The children's run states are looked for a few at a time (on S3 each is a request).

    Raises:
        NotARunError: ``native`` does not exist (``shown``: the path the user typed).
    """
    if _has_state(fs, native):
        return [native]
    if not retried_exists(fs, native):
        raise NotARunError(
            f"{shown or fsu.to_uri(fs, native)!r} does not exist: give a storage path (the "
            "RunConfig(storage_path=...) of your runs) or one run's directory"
        )
    children = [fsu.join(native, n) for n in _child_dirs(fs, native)]
    if len(children) < 2:
        return [c for c in children if _has_state(fs, c)]
    with ThreadPoolExecutor(min(_LOOKUPS, len(children))) as pool:
        found = list(pool.map(lambda c: _has_state(fs, c), children))
    return [c for c, ok in zip(children, found, strict=True) if ok]


def load_run(fs: AbstractFileSystem, run_path: str) -> StoredRun:
    """The run at ``run_path`` (a path :func:`find_runs` returned).

    Raises:
        RunStateError: The run state is corrupt or from a newer lumos-storage.
    """
    return _load(fs, run_path)


def nested_runs(run: StoredRun) -> list[str]:
    """Names of the run's subdirectories that are runs themselves (Tune trials, Train runs);
    its checkpoints are not looked into (one request each on an object store)."""
    fs, base = run.storage.fs, run.storage.run_path
    own = set(run.state.checkpoint_names())
    children = [n for n in _child_dirs(fs, base) if n not in own]
    return [n for n in children if _has_state(fs, fsu.join(base, n))]


def iso_time(ts: float | None) -> str | None:
    """Unix time as ISO 8601 UTC (``2026-12-01T15:28:20Z``); None stays None."""
    if ts is None:
        return None
    moment = datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def best_of(
    rows: list[dict[str, Any]], metric: str, mode: str
) -> tuple[int, float] | tuple[None, None]:
    """``(index, value)`` of the best ``metric`` among ``rows`` (``mode`` ``min``/``max``)."""
    scored = [(i, float(r[metric])) for i, r in enumerate(rows) if is_number(r.get(metric))]
    if not scored:
        return None, None
    pick = min if mode == "min" else max
    return pick(scored, key=lambda p: p[1])


def checkpoint_status(record: CheckpointRecord) -> str:
    """``committed``, ``validated``, ``rolled back`` or ``committed, validation <state>``."""
    if record.rolled_back:
        return "rolled back"
    status = record.validation_status
    if status is None:
        return "committed"
    if status == "validated":
        return "validated"
    return {
        "pending": "committed, validation pending",
        "failed": "committed, validation failed",
        "timeout": "committed, validation timed out",
    }[status]


def _started_at(state: RunState) -> float:
    return state.attempts[0].started_at if state.attempts else state.created_at


def summarize_run(
    run: StoredRun, metric: str | None = None, mode: str = "min", kind: str = "run"
) -> dict[str, Any]:
    """One line of ``lumos ls`` for a Train run (or any run without a plugin).

    ``best`` is the best ``metric`` over the report history when ``metric`` is
    given, else the latest report's first numeric metric with "loss" in its name
    (else its first numeric metric).
    """
    state = run.state
    rows = run.storage.read_metrics()
    best: dict[str, Any] | None = None
    if metric is not None:
        index, value = best_of(rows, metric, mode)
        if index is not None:
            best = {"metric": metric, "value": value, "mode": mode, "report": index}
    elif rows:
        best = latest_best(rows[-1], len(rows) - 1)
    return {
        "name": state.name,
        "path": run.storage.uri,
        "kind": kind,
        "status": state.status,
        "started_at": iso_time(_started_at(state)),
        "updated_at": iso_time(state.updated_at),
        "attempts": len(state.attempts),
        "reports": max(state.report_count, len(rows)),
        "checkpoints": len(state.checkpoints),
        "best": best,
    }


def describe_run(
    run: StoredRun, rows: list[dict[str, Any]] | None = None, nested: list[str] | None = None
) -> dict[str, Any]:
    """All ``lumos show`` tells of a Train run (``--json``); ``rows``, ``nested``: if read."""
    state = run.state
    rows = run.storage.read_metrics() if rows is None else rows
    attempts = [
        {
            "index": a.index,
            "status": a.status,
            "started_at": iso_time(a.started_at),
            "ended_at": iso_time(a.ended_at),
            "duration_s": None if a.ended_at is None else round(a.ended_at - a.started_at, 3),
            "error": a.error,
        }
        for a in state.attempts
    ]
    checkpoints = [
        {
            "dir_name": r.dir_name,
            "path": run.storage.checkpoint(r.dir_name).path,
            "report_index": r.report_index,
            "created_at": iso_time(r.created_at),
            "status": checkpoint_status(r),
            "latest": r.dir_name == state.latest_checkpoint,
            "metrics": r.metrics,
            "validation_error": r.validation_error,
        }
        for r in state.checkpoints
    ]
    rollbacks = [
        {
            "number": r.number,
            "check": r.check,
            "reason": r.reason,
            "from_report": r.from_report,
            "to_checkpoint": r.to_checkpoint,
            "rolled_back": list(r.rolled_back),
            "at": iso_time(r.at),
        }
        for r in state.rollbacks
    ]
    return {
        "name": state.name,
        "path": run.storage.uri,
        "kind": "run",
        "status": state.status,
        "schema_version": state.schema_version,
        "created_at": iso_time(state.created_at),
        "updated_at": iso_time(state.updated_at),
        "config": dict(state.extra),
        "attempts": attempts,
        "failures": [a for a in attempts if a["status"] == "errored" or a["error"]],
        "checkpoints": checkpoints,
        "latest_checkpoint": state.latest_checkpoint,
        "rollbacks": rollbacks,
        "reports": max(state.report_count, len(rows)),
        "latest_metrics": rows[-1] if rows else {},
        "nested_runs": nested_runs(run) if nested is None else nested,
    }
