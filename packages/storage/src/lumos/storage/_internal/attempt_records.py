"""What an attempt record says beyond its status: who failed where, how it restarted.

Parts of ``AttemptRecord`` (``state.py``), all optional, so a run state written before
they existed reads as before (no failures recorded, nothing known about the workers).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EndedBy = Literal["failure", "hang", "preemption", "resize", "rollback"]
"""``AttemptRecord.ended_by``: the event that ended the attempt (``None``: it finished,
or was stopped, or was recorded before this field existed)."""


class FailureRecord(BaseModel):
    """One failure of an attempt: a rank (or the group start) and what went wrong.

    Args:
        rank: World rank of the failed worker (-1: not one worker, e.g. the group start).
        kind: ``user_error``, ``actor_died``, ``hung`` or ``start_failed``.
        node_id: Node id of the worker, when known.
        node_ip: IP address of that node, when known.
        pid: Process id of the worker, when known.
        error_type: The exception's type (``RuntimeError``, ``lumos.train.RankStuckError``).
        message: One line: what went wrong.
        preempted: The worker was lost under a preemption notice (its own budget, not a
            ``FailureConfig(max_failures)`` failure).
        stacks: For a hang: the folder under the run's ``_lumos/`` holding every rank's
            stacks and the watchdog's finding (``hangs/attempt-<N>``).
    """

    model_config = ConfigDict(frozen=True)

    rank: int = Field(default=-1, ge=-1)
    kind: str = "user_error"
    node_id: str | None = None
    node_ip: str | None = None
    pid: int | None = None
    error_type: str | None = None
    message: str = ""
    preempted: bool = False
    stacks: str | None = None


class WorkerRecord(BaseModel):
    """Where one rank of an attempt ran.

    Args:
        rank: World rank.
        node_id: Node id.
        node_ip: IP address of the node.
        pid: Process id of the worker.
    """

    model_config = ConfigDict(frozen=True)

    rank: int = Field(ge=0)
    node_id: str | None = None
    node_ip: str | None = None
    pid: int | None = None
