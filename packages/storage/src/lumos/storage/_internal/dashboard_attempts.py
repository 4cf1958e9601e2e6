"""A run page's attempts (who failed where, how each restarted, hangs) and checkpoints.

From the attempt records' structured fields (``attempt_records``: each failure's rank,
node, error type; how the attempt started; where its ranks ran). A run stored before
those fields existed still shows the ranks and nodes its error text names
(``rank 1 on node 10.0.0.2 ...``). A hang's finding and stacks are the files the hang
watchdog wrote under ``_lumos/hangs/attempt-N/`` (``hang.json``, ``rank-R.txt``).
The checkpoints table holds the committed ones, rolled back ones, and those retention
deleted (``RunState.deleted_checkpoints``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from lumos.storage._internal import filesystem as fsu
from lumos.storage._internal.retried import retried_ls, retried_read
from lumos.storage._internal.run_view import StoredRun, iso_time
from lumos.storage._internal.state import AttemptRecord

HANGS_DIR = "hangs"
"""The hang watchdog's folder under a run's ``_lumos/`` (``hangs/attempt-N/``)."""

MAX_STACKS_BYTES = 1_000_000
"""The most of one rank's stacks a page shows."""

_HOW_STARTED = {
    "errored": "restart after a failure",
    "rolled_back": "rollback",
    "resized": "resize",
    "aborted": "resumed after an interruption",
    "running": "resumed (the driver stopped)",
    "finished": "resumed",
}
"""How an attempt started, by how the one before it ended (runs stored before
``AttemptRecord.restart`` existed)."""

_WHERE = re.compile(r"^rank (\d+)(?: on node (\S+))?")


def _failures(record: AttemptRecord, error: str | None) -> list[dict[str, Any]]:
    """Each failure of the attempt: its record, or what the error text names."""
    if record.failures:
        return [f.model_dump() for f in record.failures]
    found = [m for m in map(_WHERE.match, (error or "").split("; ")) if m]
    return [{"rank": int(m.group(1)), "node_ip": m.group(2), "kind": None} for m in found]


def _where(failures: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    ranks = [str(f["rank"]) for f in failures if f.get("rank", -1) >= 0]
    nodes = {str(f.get("node_ip") or f.get("node_id")) for f in failures}
    nodes.discard("None")
    return ", ".join(ranks) or None, ", ".join(sorted(nodes)) or None


def attempt_rows(run: StoredRun, attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``lumos show``'s attempts with the resume step, how each started, its failures
    (rank, node, error type), where its ranks ran and its hang (if the watchdog fired)."""
    state = run.state
    rows: list[dict[str, Any]] = []
    previous: str | None = None
    for a, record in zip(attempts, state.attempts, strict=True):
        resumed = [
            c.report_index
            for c in state.checkpoints
            if c.created_at <= record.started_at and not c.rolled_back
        ]
        failures = _failures(record, a["error"])
        rank, node = _where(failures)
        fallback = _HOW_STARTED.get(previous or "", "restart") if a["index"] else "first launch"
        rows.append(
            {
                **a,
                "rank": rank,
                "node": node,
                "failures": failures,
                "ended_by": record.ended_by,
                "workers": [w.model_dump() for w in record.workers],
                "resume_report": (max(resumed) + 1 if resumed else 0) if a["index"] else None,
                "restart": record.restart or fallback,
                "hang": hang_of(run, record.index, failures),
            }
        )
        previous = a["status"]
    return rows


def _hang_folder(run: StoredRun, attempt: int) -> str:
    return fsu.join(run.storage.state_dir, HANGS_DIR, f"attempt-{int(attempt)}")


def hang_of(run: StoredRun, attempt: int, failures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The watchdog's finding for ``attempt`` (culprits, where each was stuck, the ranks
    whose stacks it wrote), or None when no failure of it was a hang with stacks."""
    if not any(f.get("stacks") for f in failures):
        return None
    folder = _hang_folder(run, attempt)
    data = retried_read(run.storage.fs, fsu.join(folder, "hang.json"))
    finding = json.loads(data) if data else {}
    try:
        names = [str(n).rsplit("/", 1)[-1] for n in retried_ls(run.storage.fs, folder)]
    except FileNotFoundError:
        names = []
    ranks = sorted(int(n[5:-4]) for n in names if re.fullmatch(r"rank-\d+\.txt", n))
    culprits = finding.get("culprits") or [f["rank"] for f in failures if f.get("stacks")]
    where, why, nodes = (finding.get(k) or {} for k in ("where", "why", "nodes"))
    ips = {str(f.get("rank")): f.get("node_ip") for f in failures if f.get("node_ip")}
    nodes = {**nodes, **ips}  # the failure record's node IP, else the finding's node id
    return {
        "attempt": attempt,
        "culprits": [
            {
                "rank": r,
                "where": where.get(str(r)),
                "why": why.get(str(r)),
                "node": nodes.get(str(r)),
            }
            for r in culprits
        ],
        "stalled_s": finding.get("stalled_s"),
        "stacks_ranks": ranks,
        "folder": fsu.to_uri(run.storage.fs, folder),
    }


def stacks_text(run: StoredRun, attempt: int, rank: int) -> dict[str, Any]:
    """One rank's stacks the watchdog wrote for ``attempt`` (``/api/stacks``).

    Raises:
        FileNotFoundError: No stacks of that rank for that attempt.
    """
    path = fsu.join(_hang_folder(run, attempt), f"rank-{int(rank)}.txt")
    data = retried_read(run.storage.fs, path)
    if data is None:
        raise FileNotFoundError(f"no stacks of rank={rank} for attempt={attempt}")
    return {
        "attempt": attempt,
        "rank": rank,
        "text": data[:MAX_STACKS_BYTES].decode("utf-8", "replace"),
        "uri": fsu.to_uri(run.storage.fs, path),
    }


def deleted_rows(run: StoredRun) -> list[dict[str, Any]]:
    """The checkpoints retention deleted, as checkpoint table rows (no size, no files)."""
    return [
        {
            "dir_name": d.dir_name,
            "report_index": d.report_index,
            "created_at": iso_time(d.created_at),
            "deleted_at": iso_time(d.deleted_at),
            "status": "deleted",
            "kept": "rolled back, then deleted" if d.rolled_back else f"deleted ({d.reason})",
            "latest": False,
            "metrics": d.metrics,
            "validation_error": None,
            "size_bytes": None,
            "uri": None,
        }
        for d in run.state.deleted_checkpoints
    ]
