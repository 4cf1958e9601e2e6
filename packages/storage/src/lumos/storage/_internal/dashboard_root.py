"""The dashboard's root page from the storage path's index, in a few requests.

A root of 1,000 runs read run by run costs a state GET, a history listing and its
chunks per run. Here the page costs one listing of the root, one of its index
(``run_index``) and one batched fetch of the index records; only the runs the index
does not describe (written before it existed, or sweeps, whose row their plugin
computes from the trials) are read the old way, a few at a time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import dashboard_data as data, filesystem as fsu, run_index, run_view
from lumos.storage._internal.retried import retried_exists

LOOKUPS = 16
"""Run states looked for at once among the runs the index does not describe."""


def record_row(fs: AbstractFileSystem, root: str, record: dict[str, Any]) -> dict[str, Any]:
    """A root-page row (the keys of ``dashboard_data.root_rows``) from an index record."""
    name = str(record["name"])
    status = str(record.get("status"))
    started, updated = record.get("started_at"), record.get("updated_at")
    return {
        "name": name,
        "path": fsu.to_uri(fs, fsu.join(root, name)),
        "kind": "run",
        "status": status,
        "started_at": run_view.iso_time(started),
        "updated_at": run_view.iso_time(updated),
        "attempts": record.get("attempts"),
        "reports": record.get("reports"),
        "checkpoints": record.get("checkpoints"),
        "best": record.get("best"),
        "rel": name,
        "duration_s": data.duration(started, None if status == "running" else updated),
    }


def _unindexed_runs(fs: AbstractFileSystem, paths: list[str]) -> list[str]:
    if not paths:
        return []
    with ThreadPoolExecutor(min(LOOKUPS, len(paths))) as pool:
        found = list(pool.map(lambda p: run_view._has_state(fs, p), paths))
    return [p for p, ok in zip(paths, found, strict=True) if ok]


def _children(fs: AbstractFileSystem, root: str) -> list[str]:
    try:
        return run_view._child_dirs(fs, root)
    except FileNotFoundError:
        return []


def root_page(fs: AbstractFileSystem, root: str) -> dict[str, Any]:
    """``/api/root``: every run and sweep under ``root`` (the root itself when it is one).

    Raises:
        NotARunError: ``root`` does not exist.
    """
    uri = fsu.to_uri(fs, root)
    with ThreadPoolExecutor(3) as pool:  # three independent requests: on S3 they overlap
        single = pool.submit(run_view._has_state, fs, root)
        listing = pool.submit(_children, fs, root)
        index = pool.submit(run_index.read_index, fs, root)
        if single.result():
            return {"root": uri, "single": True, "rows": data.root_rows(fs, root, [root])}
        children, records = listing.result(), index.result()
    if not children and not retried_exists(fs, root):
        raise run_view.NotARunError(f"{uri!r} does not exist: give a storage path or a run")
    plain = {n: records[n] for n in children if n in records and records[n].get("owner") is None}
    owned = [fsu.join(root, n) for n in children if n in records and n not in plain]
    unknown = [fsu.join(root, n) for n in children if n not in records]
    slow = owned + _unindexed_runs(fs, unknown)
    rows = [record_row(fs, root, r) for r in plain.values()]
    rows += data.root_rows(fs, root, slow)
    rows.sort(key=lambda r: str(r.get("rel") or r.get("name")))
    return {"root": uri, "single": False, "rows": rows, "indexed": len(plain)}
