"""The report history under ``_lumos/metrics/``: immutable JSON chunks, replayed in order.

The one owner of the chunk format: ``write_rows`` and ``write_merge`` add a chunk,
``read_history`` lists and reads them and ``replay`` (pure) folds them into the history.
``metrics_segments`` folds many small chunks into one chunk of this same format.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu

METRICS_DIR = "metrics"
"""The history's directory under ``_lumos/``."""


def _chunk_path(directory: str, index: int) -> str:
    # "<start>-<write time ns>-<random>.json": read_history applies them in write order.
    return fsu.join(directory, f"{index:012d}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json")


def _write(fs: AbstractFileSystem, path: str, doc: dict[str, Any]) -> str:
    fsu.atomic_write_bytes(fs, path, json.dumps(doc).encode())
    return path


def write_rows(
    fs: AbstractFileSystem, directory: str, rows: list[dict[str, Any]], start_index: int
) -> str | None:
    """Store ``rows`` (reports ``start_index``, ``start_index + 1``, ...) as a new chunk.

    Returns:
        The chunk's path (None: no rows, nothing written).

    Raises:
        ValueError: ``start_index`` is negative.
    """
    if start_index < 0:
        raise ValueError(f"start_index must be >= 0, got {start_index}")
    if not rows:
        return None
    return _write(
        fs, _chunk_path(directory, start_index), {"start_index": start_index, "rows": rows}
    )


def write_merge(fs: AbstractFileSystem, directory: str, index: int, metrics: dict[str, Any]) -> str:
    """Store a chunk that merges ``metrics`` into report ``index``'s row; returns its path.

    Raises:
        ValueError: ``index`` is negative.
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    return _write(fs, _chunk_path(directory, index), {"merge_index": index, "metrics": metrics})


READ_TRIES = 3
"""Listings a reader tries when a listed chunk is gone (folded into a segment meanwhile)."""


def read_history(fs: AbstractFileSystem, directory: str) -> list[dict[str, Any]]:
    """Every chunk under ``directory``, read in write order and replayed.

    A writer folds chunks into a segment (``metrics_segments``) and then deletes them;
    a chunk that vanished between the listing and the read means a newer listing holds
    that segment, so the listing is read again (the last try replays what it found).
    """
    for attempt in range(READ_TRIES):
        contents = _read_chunks(fs, directory)
        if all(data is not None for data in contents.values()) or attempt == READ_TRIES - 1:
            break
    docs = [None if data is None else json.loads(data) for data in contents.values()]
    return replay(docs)


def _read_chunks(fs: AbstractFileSystem, directory: str) -> dict[str, bytes | None]:
    """Path -> content (None: gone since the listing) of every chunk, in write order."""
    fsu.invalidate(fs, directory)
    try:
        files = fsu.call("list", directory, fs.ls, directory, detail=False)
    except FileNotFoundError:
        return {}
    names = [str(f).rsplit("/", 1)[-1] for f in files if str(f).endswith(".json")]
    chunks = sorted(
        (n for n in names if not n.startswith(".") and n.count("-") >= 2),
        key=lambda n: (int(n.split("-")[1]), int(n.split("-")[0])),
    )
    paths = [fsu.join(directory, chunk) for chunk in chunks]
    if fsu.is_local(fs) or len(paths) < 2:
        return {p: fsu.read_bytes(fs, p) for p in paths}
    # one batched, concurrent fetch (s3fs: async), retried as a whole
    found = fsu.call("read", directory, fs.cat, paths, on_error="omit")
    return {p: found.get(p, found.get(fsu.to_uri(fs, p))) for p in paths}


def replay(docs: Iterable[Any]) -> list[dict[str, Any]]:
    """The history that chunks ``docs`` (in write order) describe.

    A rows chunk replaces the history from its ``start_index`` on (a run resumed from
    an earlier checkpoint reports again); a merge chunk updates one existing row.
    Anything that is not a JSON object (a chunk gone since the listing) is skipped.
    """
    history: list[dict[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if "merge_index" in doc:
            at = int(doc["merge_index"])
            if at < len(history):
                history[at] = {**history[at], **doc["metrics"]}
            continue
        start = int(doc["start_index"])
        history = history[:start] + list(doc["rows"])
    return history
