"""The run state document (versioned pydantic models) written under ``_lumos/``."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lumos.storage._internal.names import validate_name

SCHEMA_VERSION = 1

RunStatus = Literal["running", "finished", "errored", "aborted"]


class CheckpointRecord(BaseModel):
    """A committed checkpoint as recorded in the run state.

    Args:
        dir_name: Directory of the checkpoint inside the run directory.
        metrics: The metrics reported with the checkpoint.
        report_index: Index of the report that carried the checkpoint.
        created_at: Unix time of the commit.
    """

    model_config = ConfigDict(frozen=True)

    dir_name: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    report_index: int = Field(default=0, ge=0)
    created_at: float = Field(default_factory=time.time)

    @field_validator("dir_name")
    @classmethod
    def _check_dir_name(cls, value: str) -> str:
        return validate_name(value, "checkpoint_dir_name")


class AttemptRecord(BaseModel):
    """One attempt (start of the run or a restart after a failure).

    Args:
        index: 0 for the first attempt, then 1, 2, ...
        started_at: Unix time the attempt started.
        ended_at: Unix time it ended, None while running.
        status: ``running``, ``finished``, ``errored`` or ``aborted``.
        error: A description of the error that ended it, if any.
    """

    index: int = Field(ge=0)
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    status: RunStatus = "running"
    error: str | None = None


class RunState(BaseModel):
    """The state of one run: committed checkpoints, attempts and status.

    A checkpoint counts as committed only once a RunState naming it has been
    written (see ``RunStorage.commit_checkpoint``).

    Example:
        >>> state = RunState(name="run-42")
        >>> state.latest() is None
        True
    """

    schema_version: int = SCHEMA_VERSION
    name: str
    status: RunStatus = "running"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    latest_checkpoint: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    report_count: int = Field(default=0, ge=0)
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return validate_name(value, "name")

    def latest(self) -> CheckpointRecord | None:
        """The latest committed checkpoint, or None when there is none."""
        if self.latest_checkpoint is None:
            return None
        for record in reversed(self.checkpoints):
            if record.dir_name == self.latest_checkpoint:
                return record
        return None

    def checkpoint_names(self) -> list[str]:
        """Directory names of the committed checkpoints, oldest first."""
        return [r.dir_name for r in self.checkpoints]
