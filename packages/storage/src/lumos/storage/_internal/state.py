"""The run state document (versioned pydantic models) written under ``_lumos/``."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lumos.storage._internal.attempt_records import EndedBy, FailureRecord, WorkerRecord
from lumos.storage._internal.checkpoint_log import DeletedCheckpoint
from lumos.storage._internal.errors import RunStateError
from lumos.storage._internal.names import validate_name

SCHEMA_VERSION = 1
"""The run state schema this version writes (and the newest it reads)."""

RunStatus = Literal["running", "finished", "errored", "aborted"]
"""``RunState.status``."""

AttemptStatus = Literal["running", "finished", "errored", "aborted", "rolled_back", "resized"]
"""``AttemptRecord.status``."""

ValidationStatus = Literal["pending", "validated", "timeout", "failed"]
"""``CheckpointRecord.validation_status`` (``None``: no validation requested)."""


class CheckpointRecord(BaseModel):
    """A committed checkpoint as recorded in the run state.

    Args:
        dir_name: Directory of the checkpoint inside the run directory.
        metrics: The metrics reported with the checkpoint.
        report_index: Index of the report that carried the checkpoint.
        created_at: Unix time of the commit.
        validation_status: ``None`` (no validation requested), ``"pending"``,
            ``"validated"``, ``"timeout"`` or ``"failed"``. A validation's metrics are
            merged into ``metrics``.
        validation_request: What the pending validation runs with (``fn_kwargs``,
            ``timeout_s``), so that a resumed run can run it again.
        validation_error: Why the validation failed or timed out.
        rolled_back: A health check rolled the run back to an earlier checkpoint; this
            one is never resumed from again (retention drops it first).
    """

    model_config = ConfigDict(frozen=True)

    dir_name: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    report_index: int = Field(default=0, ge=0)
    created_at: float = Field(default_factory=time.time)
    validation_status: ValidationStatus | None = None
    validation_request: dict[str, Any] | None = None
    validation_error: str | None = None
    rolled_back: bool = False

    @field_validator("dir_name")
    @classmethod
    def _check_dir_name(cls, value: str) -> str:
        return validate_name(value, "checkpoint_dir_name")

    @property
    def validation_pending(self) -> bool:
        """Whether a validation of this checkpoint is requested and has not ended."""
        return self.validation_status == "pending"


class AttemptRecord(BaseModel):
    """One attempt (start of the run or a restart after a failure).

    Args:
        index: 0 for the first attempt, then 1, 2, ...
        started_at: Unix time the attempt started.
        ended_at: Unix time it ended, None while running.
        status: ``running``, ``finished``, ``errored``, ``aborted``, ``rolled_back`` or
            ``resized``.
        error: A description of the error that ended it, if any.
        failures: Each failed rank with its node, error type and message (empty: none,
            or recorded before this field existed).
        ended_by: The event that ended it (see ``EndedBy``).
        restart: How it was started (``new group``, ``replaced rank 1 (standby)``, ...).
        workers: Where each rank ran (empty: unknown).
    """

    index: int = Field(ge=0)
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    status: AttemptStatus = "running"
    error: str | None = None
    failures: list[FailureRecord] = Field(default_factory=list)
    ended_by: EndedBy | None = None
    restart: str | None = None
    workers: list[WorkerRecord] = Field(default_factory=list)


class RollbackRecord(BaseModel):
    """One health rollback of a run (``RunState.rollbacks``).

    Args:
        number: 1 for the run's first rollback, then 2, 3, ...
        check: The health check that fired (its name).
        reason: Why it fired.
        from_report: Index of the report (or of the validated checkpoint's report)
            that made it fire.
        to_checkpoint: The checkpoint training resumed from (``None``: the start).
        to_report_index: That checkpoint's report index (``None``: the start).
        rolled_back: Directory names (after renaming) of the checkpoints rolled back.
        metrics: The metrics the check fired on.
        at: Unix time of the rollback.
    """

    model_config = ConfigDict(frozen=True)

    number: int = Field(ge=1)
    check: str
    reason: str
    from_report: int = Field(ge=0)
    to_checkpoint: str | None = None
    to_report_index: int | None = None
    rolled_back: list[str] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    at: float = Field(default_factory=time.time)


class RunState(BaseModel):
    """The state of one run: committed checkpoints, attempts and status.

    A checkpoint counts as committed only once a RunState naming it has been
    written (see ``RunStorage.commit_checkpoint``); ``deleted_checkpoints`` logs the
    ones retention dropped since (``checkpoint_log``).

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
    rollbacks: list[RollbackRecord] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    deleted_checkpoints: list[DeletedCheckpoint] = Field(default_factory=list)

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
        """Directory names of the committed checkpoints (rolled back ones too), oldest first."""
        return [r.dir_name for r in self.checkpoints]

    def live_checkpoints(self) -> list[CheckpointRecord]:
        """The committed checkpoints that were not rolled back, oldest first."""
        return [r for r in self.checkpoints if not r.rolled_back]


def encode_state(state: RunState) -> bytes:
    """The run state document's bytes (what ``decode_state`` reads)."""
    return state.model_dump_json(indent=1).encode()


def decode_state(data: bytes, path: str) -> RunState:
    """The run state in document ``data``, read from ``path``.

    Raises:
        RunStateError: The document is corrupt, invalid or from a newer schema.
    """
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise RunStateError(path, f"not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise RunStateError(path, "not a JSON object")
    version = raw.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise RunStateError(path, f"schema_version={version!r} is not valid")
    if version > SCHEMA_VERSION:
        raise RunStateError(
            path,
            f"schema_version={version} was written by a newer lumos-storage (this one reads "
            f"up to {SCHEMA_VERSION}); upgrade: pip install -U lumos-storage",
        )
    try:
        return RunState.model_validate(raw)
    except ValidationError as exc:
        raise RunStateError(path, str(exc)) from exc
