"""The structured parts of an attempt's record: who failed where, how the next one started.

Pure functions from what the controller knows (the failures, the group's workers, the
scheduling decision) to ``lumos.storage`` records; the run book stores them with the
attempt (``RunBook.begin_attempt`` / ``end_attempt``) and the dashboard shows them, so
it never has to parse rank and node out of the error text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lumos.runtime import FailureKind, WorkerFailure, WorkerInfo
from lumos.storage import FailureRecord, WorkerRecord
from lumos.train._internal.controller import messages

_STACKS_MARK = "/_lumos/"


@dataclass(frozen=True)
class Replacement:
    """Ranks the group replaced in place (``by_standby``: those a standby worker took)."""

    ranks: tuple[int, ...]
    by_standby: tuple[int, ...] = ()


def _stacks_of(failure: WorkerFailure) -> str | None:
    """A hang's stacks folder under ``_lumos/`` (``hangs/attempt-N``), from its RankStuckError."""
    cause = getattr(failure.error, "cause", None) if failure.error is not None else None
    path = getattr(cause, "stacks_path", None)
    if not isinstance(path, str) or _STACKS_MARK not in path:
        return None
    return path.rsplit(_STACKS_MARK, 1)[1]


def failure_records(
    failures: Sequence[WorkerFailure], workers: Sequence[WorkerInfo], *, preempted: bool = False
) -> list[FailureRecord]:
    """One record per failure, with the node and process of its rank where known."""
    out: list[FailureRecord] = []
    for f in failures:
        w = workers[f.rank] if 0 <= f.rank < len(workers) else None
        out.append(
            FailureRecord(
                rank=max(f.rank, -1),
                kind=f.kind.value,
                node_id=f.node_id or (w.node_id if w else None),
                node_ip=w.node_ip if w else None,
                pid=w.pid if w else None,
                error_type=f.error.exc_type if f.error is not None else None,
                message=f.message,
                preempted=preempted,
                stacks=_stacks_of(f),
            )
        )
    return out


def ended_by(
    failures: Sequence[WorkerFailure], preempted: bool
) -> Literal["failure", "hang", "preemption"]:
    """``preemption``, ``hang`` (the watchdog found a stuck rank) or ``failure``."""
    if preempted:
        return "preemption"
    if any(f.kind is FailureKind.HUNG for f in failures):
        return "hang"
    return "failure"


def worker_records(workers: Sequence[WorkerInfo]) -> list[WorkerRecord]:
    """Where each rank of a started attempt runs."""
    return [
        WorkerRecord(rank=w.world_rank, node_id=w.node_id, node_ip=w.node_ip, pid=w.pid)
        for w in workers
    ]


def restart_text(
    attempt: int,
    *,
    first_launch: bool,
    after: str | None,
    kept_group: bool,
    replaced: Sequence[Replacement],
) -> str:
    """How attempt ``attempt`` started (see ``messages.restart_text``)."""
    ranks = sorted({r for rep in replaced for r in rep.ranks})
    standby = sorted({r for rep in replaced for r in rep.by_standby})
    return messages.restart_text(
        attempt,
        first_launch=first_launch,
        after=after,
        kept_group=kept_group,
        replaced=ranks,
        by_standby=standby,
    )
