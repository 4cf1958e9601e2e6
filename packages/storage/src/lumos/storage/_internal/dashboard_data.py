"""What the web dashboard shows, as JSON-able dicts: the storage root, a run, a sweep.

Read-only. Everything comes from the readers ``lumos ls`` / ``lumos show`` use
(``run_view``, ``cli_plugins``): a root row is a ``lumos ls`` row, a run page starts
from ``lumos show --json``'s dict, a sweep page from the Tune plugin's ``describe``.
What those do not hold is added here: durations, the metrics history as columns
with the restart and rollback markers, checkpoint sizes, and each trial's reports,
read from the trial journal's documented format (one JSON object per line, see
``lumos.tune``'s ``trial_journal.py``), so this package never imports lumos-tune.
"""

from __future__ import annotations

import datetime
import json
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import (
    dashboard_attempts as attempts_view,
    filesystem as fsu,
    run_index,
    run_view,
)
from lumos.storage._internal.cli_plugins import CliPlugin, summary_row
from lumos.storage._internal.dashboard_series import chart_columns, columns
from lumos.storage._internal.retried import retried_ls, retried_read
from lumos.storage._internal.run_storage import STATE_DIR
from lumos.storage._internal.run_view import StoredRun, is_number, iso_time

READERS = 16
"""Runs read at once for the root page (an S3 read is a round trip: they overlap)."""

MAX_SIZED_CHECKPOINTS = 200
"""A run page sizes at most this many checkpoints (newest first); the rest show no size."""

MAX_LINKED_TRIALS = 500
"""A sweep page looks for the Train runs of at most this many trials (a listing each)."""

TRIALS_JOURNAL = "trials.journal"
"""lumos-tune's trial journal under the sweep's ``_lumos/`` (a file, or ``<name>.d/`` chunks)."""


def relative(root: str, run_path: str) -> str:
    """``run_path`` relative to the served ``root`` (``""``: the root itself)."""
    root, run_path = root.rstrip("/"), run_path.rstrip("/")
    if run_path == root:
        return ""
    return run_path[len(root) + 1 :] if run_path.startswith(root + "/") else run_path


def duration(started: float | None, ended: float | None) -> float | None:
    """Seconds from ``started`` to ``ended`` (still going: to now); None without a start."""
    if started is None:
        return None
    return round((ended if ended is not None else time.time()) - started, 3)


def _unix(iso: str | None) -> float | None:
    """``iso_time``'s text back as Unix time (None stays None)."""
    if not iso:
        return None
    moment = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()


def root_rows(fs: AbstractFileSystem, root: str, paths: list[str]) -> list[dict[str, Any]]:
    """One row per run or sweep under ``root``: a ``lumos ls`` row, plus ``rel`` and timing."""

    def row(path: str) -> dict[str, Any]:
        out = summary_row(fs, path, None, None)
        out["rel"] = relative(root, path)
        started, updated = _unix(out.get("started_at")), _unix(out.get("updated_at"))
        out["duration_s"] = duration(started, None if out["status"] == "running" else updated)
        out.setdefault("reports", out.get("trials"))
        return out

    if len(paths) <= 1:
        return [row(p) for p in paths]
    with ThreadPoolExecutor(min(READERS, len(paths))) as pool:
        return list(pool.map(row, paths))


def _size(fs: AbstractFileSystem, path: str) -> int | None:
    try:
        return int(fsu.call("du", path, fs.du, path))
    except Exception:  # gone since the state was read, or no listing right
        return None


def _sized_checkpoints(run: StoredRun, checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fs = run.storage.fs
    sized = checkpoints[-MAX_SIZED_CHECKPOINTS:]
    with ThreadPoolExecutor(min(READERS, max(1, len(sized)))) as pool:
        sizes = list(pool.map(lambda c: _size(fs, c["path"]), sized))
    by_name = {c["dir_name"]: s for c, s in zip(sized, sizes, strict=True)}
    return [
        {
            **c,
            "size_bytes": by_name.get(c["dir_name"]),
            "kept": "rolled back" if c["status"] == "rolled back" else "kept",
            "uri": fsu.to_uri(fs, c["path"]),
        }
        for c in checkpoints
    ]


def run_detail(root: str, run: StoredRun) -> dict[str, Any]:
    """A run page: ``lumos show --json``'s dict with the timeline, sizes and nested runs' paths."""
    with ThreadPoolExecutor(3) as pool:  # three independent reads: on S3 they overlap
        rows_read = pool.submit(run.storage.read_metrics)
        nested = pool.submit(run_view.nested_runs, run)
        sized = pool.submit(
            _sized_checkpoints, run, run_view.describe_run(run, [], [])["checkpoints"]
        )
        rows = rows_read.result()
        detail = run_view.describe_run(run, rows, nested.result())
    rel = relative(root, run.storage.run_path)
    started = run.state.attempts[0].started_at if run.state.attempts else run.state.created_at
    ended = None if run.state.status == "running" else run.state.updated_at
    detail.update(
        rel=rel,
        duration_s=duration(started, ended),
        attempts=attempts_view.attempt_rows(run, detail["attempts"]),
        checkpoints=sized.result(),
        deleted_checkpoints=attempts_view.deleted_rows(run),
        nested=[
            {"name": n, "rel": posixpath.join(rel, n) if rel else n} for n in detail["nested_runs"]
        ],
    )
    detail["metrics"] = _metrics(run, rows, detail["attempts"])
    return detail


def _metrics(
    run: StoredRun, rows: list[dict[str, Any]], attempts: list[dict[str, Any]]
) -> dict[str, Any]:
    markers = [
        {
            "step": a["resume_report"],
            "kind": "restart",
            "label": f"attempt {a['index']}: {a['restart']}",
        }
        for a in attempts
        if a["resume_report"] is not None and a["restart"] != "rollback"  # marked below
    ]
    markers += [
        {"step": r.from_report, "kind": "rollback", "label": f"rollback {r.number}: {r.reason}"}
        for r in run.state.rollbacks
    ]
    return {**chart_columns(rows), "markers": markers}


def run_metrics(run: StoredRun) -> dict[str, Any]:
    """A run's history against step (report index), with its restart and rollback markers."""
    rows = run.storage.read_metrics()
    attempts = attempts_view.attempt_rows(run, run_view.describe_run(run, rows)["attempts"])
    return _metrics(run, rows, attempts)


def _journal_lines(fs: AbstractFileSystem, path: str) -> list[str]:
    data = retried_read(fs, path) if fsu.is_local(fs) else None
    if data is not None:
        return data[: data.rfind(b"\n") + 1].decode("utf-8").splitlines()
    lines: list[str] = []
    try:
        names = sorted(str(n) for n in retried_ls(fs, path + ".d"))
    except FileNotFoundError:
        return lines
    for name in names:
        if name.endswith(".jsonl"):
            chunk = retried_read(fs, name)
            lines += [] if chunk is None else chunk.decode("utf-8").splitlines()
    return lines


def trial_reports(run: StoredRun) -> dict[int, list[dict[str, Any]]]:
    """Each trial's reports (trial number -> metrics in iteration order) from the journal.

    A report record is ``{"e": "r", "n": <trial>, "i": <iteration>, "m": {...}}``; a
    retried trial reports its iterations again, and the later report of one wins.
    """
    path = fsu.join(run.storage.state_dir, TRIALS_JOURNAL)
    by_trial: dict[int, dict[int, dict[str, Any]]] = {}
    for line in _journal_lines(run.storage.fs, path):
        try:
            raw = json.loads(line)
        except ValueError:
            continue  # a torn last line of a journal being written
        if isinstance(raw, dict) and raw.get("e") == "r" and isinstance(raw.get("n"), int):
            reports = by_trial.setdefault(raw["n"], {})
            reports[int(raw.get("i", len(reports) + 1))] = dict(raw.get("m") or {})
    return {n: [r[i] for i in sorted(r)] for n, r in by_trial.items()}


def _modified(entry: dict[str, Any]) -> float | None:
    """A listing entry's modification time (local ``mtime``, S3 ``LastModified``)."""
    value = entry.get("mtime", entry.get("LastModified"))
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    return float(value) if isinstance(value, int | float) and is_number(value) else None


def _trial_runs(
    sweep: StoredRun, rel: str, trial: dict[str, Any], index: dict[str, dict[str, Any]]
) -> tuple[str | None, list[dict[str, str]], float | None]:
    """A trial's own run page (None: its directory holds no run state), the Train runs in
    it, and when it last changed (its index records', else its files' latest time)."""
    base = posixpath.basename(str(trial.get("path") or "").rstrip("/"))
    if not base:
        return None, [], None
    fs = sweep.storage.fs
    path = fsu.join(sweep.storage.run_path, base)
    trial_rel = posixpath.join(rel, base) if rel else base
    try:
        entries = retried_ls(fs, path, detail=True)
    except (FileNotFoundError, OSError):
        entries = []
    names = {
        posixpath.basename(str(e["name"]).rstrip("/"))
        for e in entries
        if e.get("type") == "directory"
    }
    names.discard(STATE_DIR)
    nested = [n for n in sorted(names) if run_view._has_state(fs, fsu.join(path, n))]
    records = (
        [index.get(base) or {}, *run_index.read_index(fs, path).values()]
        if nested
        else [index.get(base) or {}]
    )
    times = [float(r["updated_at"]) for r in records if is_number(r.get("updated_at"))]
    times = times or [t for t in map(_modified, entries) if t is not None]
    own = trial_rel if run_view._has_state(fs, path) else None
    links = [{"name": n, "rel": posixpath.join(trial_rel, n)} for n in nested]
    return own, links, max(times) if times else None


def sweep_detail(root: str, run: StoredRun, plugin: CliPlugin) -> dict[str, Any]:
    """A sweep page: the plugin's ``describe``, each trial's curves and its run page's path."""
    detail = plugin.describe(run)
    rel = relative(root, run.storage.run_path)
    reports = trial_reports(run)
    trials = detail.get("trials", [])
    index = run_index.read_index(run.storage.fs, run.storage.run_path)  # the trials' records
    with ThreadPoolExecutor(READERS) as pool:
        found = list(
            pool.map(lambda t: _trial_runs(run, rel, t, index), trials[:MAX_LINKED_TRIALS])
        )
    for i, trial in enumerate(trials):
        trial["rel"], trial["runs"], updated = found[i] if i < len(found) else (None, [], None)
        trial["updated_at"] = iso_time(updated)
        trial["curves"] = columns(reports.get(int(trial.get("number", -1)), []))
    detail.update(
        rel=rel,
        optuna_command=f"lumos dashboard {run.storage.uri} --optuna",
        started_at=detail.get("created_at"),
    )
    return detail


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The JSON an endpoint answers with when a read fails."""
    return {"error": f"{type(exc).__name__}: {exc}", "at": iso_time(time.time())}
