"""The checkpoints a run deleted: what retention dropped, kept in the run state as a log.

A committed checkpoint that retention drops leaves ``RunState.checkpoints``; without a
trace, a dashboard could not show what a run had and why it is gone. Each drop appends
a :class:`DeletedCheckpoint` to ``RunState.deleted_checkpoints`` in the same state
write that stops naming it (``RunStorage.update_checkpoints``), so the log never names
a checkpoint still committed. The log keeps the newest :data:`MAX_DELETED` entries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_DELETED = 200
"""Entries ``RunState.deleted_checkpoints`` keeps (the oldest go first)."""


class DeletedCheckpoint(BaseModel):
    """A checkpoint the run deleted (``RunState.deleted_checkpoints``).

    Args:
        dir_name: Its directory name (after a rollback's rename).
        report_index: Index of the report that carried it.
        metrics: Its metrics (a validation's merged in).
        created_at: Unix time of its commit.
        deleted_at: Unix time of the state write that dropped it.
        reason: ``retention`` (``CheckpointConfig(num_to_keep)``).
        rolled_back: It had been rolled back before it was dropped.
    """

    model_config = ConfigDict(frozen=True)

    dir_name: str
    report_index: int = Field(default=0, ge=0)
    metrics: dict[str, Any] = Field(default_factory=dict)
    created_at: float | None = None
    deleted_at: float = Field(default_factory=time.time)
    reason: str = "retention"
    rolled_back: bool = False


def with_dropped(
    log: Sequence[DeletedCheckpoint], dropped: Sequence[Any]
) -> list[DeletedCheckpoint]:
    """``log`` plus one entry per dropped ``CheckpointRecord`` (pure), newest last, capped."""
    now = time.time()
    added = [
        DeletedCheckpoint(
            dir_name=r.dir_name,
            report_index=r.report_index,
            metrics=dict(r.metrics),
            created_at=r.created_at,
            deleted_at=now,
            rolled_back=r.rolled_back,
        )
        for r in dropped
    ]
    return [*log, *added][-MAX_DELETED:]
