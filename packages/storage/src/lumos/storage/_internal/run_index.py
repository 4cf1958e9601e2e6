"""The storage root's index: one small summary record per run, under ``{storage_path}/_lumos/index/``.

Reading a root of 1,000 runs one run state and one metrics history at a time costs
thousands of requests on an object store, and even one GET per run is 1,000. So every
run keeps a summary of itself next to its siblings, and the summary is spelled in the
file's NAME: ``{storage_path}/_lumos/index/{name}/{time_ns:020d}-{record}.json``, the
record as unpadded URL-safe base64 JSON (the file holds the same JSON). One recursive
listing of the index (1,000 keys a request on S3) then reads every record, with no GET.
A record too long for a name (a long metric name; local file names stop at 255 bytes)
is named ``{time_ns:020d}-_.json`` and read from the file.

Each save of the run state writes a new record (one atomic put, through the storage
retry policy), then deletes the run's older ones; a reader that finds several (a save
in between, or a crash before the delete) takes the newest. This module is the one
owner of the format.

The record is a cache, never the truth: a run without one (written before the index
existed) is read the slow way, and a failed index write never fails the state write
that came first (the next save writes it again).

Record (``"v": 1``)::

    {"v": 1, "name": ..., "owner": "tune" | null, "status": ..., "started_at": <unix>,
     "updated_at": <unix>, "attempts": n, "reports": n, "checkpoints": n,
     "best": {"metric": ..., "value": ..., "mode": "latest", "report": i} | null}
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu
from lumos.storage._internal.errors import StorageError
from lumos.storage._internal.state import RunState

INDEX_DIR = "_lumos/index"
"""The index's folder under a storage path (``_lumos`` is never a run's name)."""

RECORD_VERSION = 1
"""The record format this version writes (and the newest it reads)."""

KNOWN_OWNERS: dict[str, tuple[str, str]] = {"tune": ("sweep", "lumos-tune")}
"""``RunState.extra`` key -> (kind, the package that reads it).

A state whose ``extra`` holds one of these keys was written by that package (a Tune
experiment stores ``extra["tune"] = {"metric": ..., "mode": ...}``); the package's
``lumos.cli`` plugin, registered under the same key, shows it.
"""


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real, finite number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def owner_of(state: RunState) -> str | None:
    """The key of ``state.extra`` naming the package that wrote the run, if any."""
    return next((key for key in state.extra if key in KNOWN_OWNERS), None)


def latest_best(row: dict[str, Any] | None, index: int) -> dict[str, Any] | None:
    """A row's headline metric: its first numeric metric with "loss" in its name, else
    its first numeric metric (``index``: the row's report index); None without one."""
    if not row:
        return None
    numeric = [k for k, v in row.items() if is_number(v)]
    # A loss says more than the step counter that often comes first.
    key = next((k for k in numeric if "loss" in k.lower()), numeric[0] if numeric else None)
    if key is None:
        return None
    return {"metric": key, "value": row[key], "mode": "latest", "report": index}


NAME_LIMIT_LOCAL = 200
"""Longest encoded record in a local file name (most filesystems allow 255 bytes)."""

NAME_LIMIT = 900
"""Longest encoded record in an object key (S3 allows 1,024 bytes for the whole key)."""

_LONG = "_"  # the name part of a record read from the file


def index_folder(storage_path: str, name: str) -> str:
    """Where run ``name`` under ``storage_path`` keeps its records."""
    return fsu.join(storage_path, INDEX_DIR, name)


def build_record(state: RunState, reports: int, best: dict[str, Any] | None) -> dict[str, Any]:
    """The record of ``state`` (pure): ``reports`` and ``best`` come from the history."""
    started = state.attempts[0].started_at if state.attempts else state.created_at
    return {
        "v": RECORD_VERSION,
        "name": state.name,
        "owner": owner_of(state),
        "status": state.status,
        "started_at": started,
        "updated_at": state.updated_at,
        "attempts": len(state.attempts),
        "reports": max(state.report_count, reports),
        "checkpoints": len(state.checkpoints),
        "best": best,
    }


_SPELLED = (
    "v",
    "owner",
    "status",
    "started_at",
    "updated_at",
    "attempts",
    "reports",
    "checkpoints",
)
"""The fields a name spells, in order (then ``best`` as ``[metric, value, report]``); the
run's name is its folder's."""


def _spell(record: dict[str, Any]) -> list[Any]:
    values = [record.get(k) for k in _SPELLED]
    values[3:5] = [None if t is None else round(float(t), 3) for t in values[3:5]]
    best = record.get("best")
    return [*values, [best["metric"], best["value"], best["report"]] if best else None]


def _unspell(values: Any, name: str) -> dict[str, Any] | None:
    if not isinstance(values, list) or len(values) != len(_SPELLED) + 1:
        return None
    record = dict(zip(_SPELLED, values[:-1], strict=True))
    best = values[-1]
    if isinstance(best, list) and len(best) == 3:
        record["best"] = {"metric": best[0], "value": best[1], "mode": "latest", "report": best[2]}
    else:
        record["best"] = None
    return {**record, "name": name}


def record_file_name(seq: int, record: dict[str, Any], limit: int) -> str:
    """The file name of ``record`` (``seq``: its write time in ns, newest wins)."""
    data = json.dumps(_spell(record), separators=(",", ":"), allow_nan=False).encode()
    spelled = base64.urlsafe_b64encode(data).decode().rstrip("=")
    return f"{seq:020d}-{spelled if len(spelled) <= limit else _LONG}.json"


def parse_record(data: bytes | None) -> dict[str, Any] | None:
    """A stored record, or None when it is missing, torn or from a newer format."""
    if data is None:
        return None
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("v") != RECORD_VERSION or "name" not in raw:
        return None
    return raw


def _split(file_name: str) -> tuple[int, str] | None:
    """``(seq, spelled record)`` of a record's file name; None for anything else."""
    if not file_name.endswith(".json") or "-" not in file_name:
        return None
    seq, spelled = file_name[: -len(".json")].split("-", 1)
    return (int(seq), spelled) if seq.isdigit() else None


def record_from_name(file_name: str, name: str) -> dict[str, Any] | None:
    """The record of run ``name`` spelled in ``file_name`` (None: not one, or spelled in
    the file only)."""
    parts = _split(file_name)
    if parts is None or parts[1] == _LONG:
        return None
    try:
        data = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        record = _unspell(json.loads(data), name)
    except (binascii.Error, ValueError):
        return None
    return parse_record(json.dumps(record).encode()) if record else None


def _list(fs: AbstractFileSystem, folder: str) -> list[str]:
    fsu.invalidate(fs, folder)
    try:
        found = fsu.call("list", folder, fs.find, folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [str(p) for p in found]


REFRESH_S = 5.0
"""A record whose status and attempts did not change is rewritten at most this often:
its counts (reports, checkpoints, best) may lag the run state by that much, never its
status (a status or attempt change is written with the state save that made it)."""


class RunIndexWriter:
    """Keeps one run's record current; ``RunStorage`` owns one per run.

    It remembers the last history row this process appended (the headline metric),
    and on the first save of a resumed run, before any append, keeps what the
    previous record said.

    Args:
        fs: The run's filesystem.
        storage_path: The run's parent (the storage root the index belongs to).
        name: The run's name.
    """

    def __init__(self, fs: AbstractFileSystem, storage_path: str, name: str) -> None:
        self.fs = fs
        self.folder = index_folder(storage_path, name)
        self.limit = NAME_LIMIT_LOCAL if fsu.is_local(fs) else NAME_LIMIT
        self._reports = 0
        self._best: dict[str, Any] | None = None
        self._known = False  # whether _reports/_best describe the history yet
        self._written: list[str] | None = None  # this run's record files (None: not listed)
        self._shape: tuple[str, int] | None = None  # (status, attempts) of the last record
        self._written_at = float("-inf")  # monotonic time of the last record

    def rows_appended(self, rows: list[dict[str, Any]], start_index: int) -> None:
        """The history got ``rows`` from ``start_index`` on (no I/O)."""
        if rows:
            end = start_index + len(rows)
            self._reports, self._known = end, True
            self._best = latest_best(rows[-1], end - 1)

    def state_saved(self, state: RunState) -> None:
        """Write the record of ``state`` (just saved), then delete the older ones; a
        failure leaves the old record in place (a cache: the next save writes it again)."""
        shape = (state.status, len(state.attempts))
        now = time.monotonic()
        if shape == self._shape and now - self._written_at < REFRESH_S:
            return  # only counts changed: a SYNC commit does not pay for the cache
        try:
            self._write(state)
            self._shape, self._written_at = shape, now
        except (StorageError, OSError, ValueError):
            pass  # readers fall back to the run state itself meanwhile

    def _write(self, state: RunState) -> None:
        if self._written is None:
            self._written = sorted(_list(self.fs, self.folder))
            if not self._known:  # a resumed run's first save: keep what the history said
                previous = read_newest(self.fs, self._written) or {}
                self._reports = int(previous.get("reports") or 0)
                self._best, self._known = previous.get("best"), True
        record = build_record(state, self._reports, self._best)
        name = record_file_name(time.time_ns(), record, self.limit)
        path = fsu.join(self.folder, name)
        fsu.atomic_write_bytes(self.fs, path, json.dumps(record).encode())
        old, self._written = self._written, [path]
        if old:
            fsu.call("delete", self.folder, self.fs.rm, old)


def read_newest(fs: AbstractFileSystem, paths: list[str]) -> dict[str, Any] | None:
    """The newest record among one run's record files (from its name, else its file)."""
    named = [(parts[0], p) for p in paths if (parts := _split(p.rsplit("/", 1)[-1]))]
    if not named:
        return None
    path = max(named)[1]
    folder, file_name = path.rsplit("/", 2)[-2:]
    record = record_from_name(file_name, folder)
    return record if record is not None else parse_record(fsu.read_bytes(fs, path))


def read_index(fs: AbstractFileSystem, storage_path: str) -> dict[str, dict[str, Any]]:
    """Every run's newest record under ``storage_path`` (run name -> record): one
    recursive listing, plus one batched fetch of the records too long for a name."""
    newest: dict[str, tuple[int, str]] = {}
    for path in _list(fs, fsu.join(storage_path, INDEX_DIR)):
        parts = path.rstrip("/").rsplit("/", 2)
        split = _split(parts[-1]) if len(parts) == 3 else None
        if split is not None and split[0] >= newest.get(parts[1], (-1, ""))[0]:
            newest[parts[1]] = (split[0], path)
    records: dict[str, dict[str, Any]] = {}
    long: dict[str, str] = {}
    for name, (_seq, path) in newest.items():
        record = record_from_name(path.rsplit("/", 1)[-1], name)
        if record is not None:
            records[name] = record
        else:
            long[name] = path
    if long:
        paths = list(long.values())
        if fsu.is_local(fs) or len(paths) < 2:
            found: dict[str, Any] = {p: fsu.read_bytes(fs, p) for p in paths}
        else:
            found = fsu.call("read", paths[0], fs.cat, paths, on_error="omit")
        for name, path in long.items():
            data = found.get(path, found.get(fsu.to_uri(fs, path)))
            record = parse_record(data if isinstance(data, bytes) else None)
            if record is not None:
                records[name] = record
    return {name: r for name, r in records.items() if r.get("name") == name}
