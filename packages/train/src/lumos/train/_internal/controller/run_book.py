"""RunBook: the run's stored state (status, attempts, committed checkpoints).

Every change builds a new ``RunState`` and saves it through ``RunStorage``
before the controller goes on, so the stored state is always what a resumed
run (``fit()`` again with the same ``RunConfig(storage_path, name)``) starts from.
Checkpoint commits go through ``RunStorage.commit_checkpoint``, which writes the
new state before it deletes what the retention policy drops.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from lumos.storage import (
    AttemptRecord,
    Checkpoint,
    CheckpointRecord,
    RetentionPolicy,
    RunState,
    RunStorage,
)
from lumos.train._internal.errors import CheckpointReportError
from lumos.train._internal.result import Result, result_from_state

RunStatus = Literal["running", "finished", "errored", "aborted"]
AttemptStatus = Literal["finished", "errored", "aborted"]


class RunBook:
    """Keeps one run's ``RunState`` and saves every change of it.

    Args:
        storage: The run's storage.
        state: Its current state (new, or loaded to resume).
        retention: Which committed checkpoints to keep (``None``: all).
    """

    def __init__(
        self, storage: RunStorage, state: RunState, retention: RetentionPolicy | None = None
    ) -> None:
        self.storage = storage
        self.state = state
        self.retention = retention

    @property
    def attempts(self) -> int:
        """How many attempts the run has started so far (also in earlier ``fit()`` calls)."""
        return len(self.state.attempts)

    def latest(self) -> CheckpointRecord | None:
        """The latest committed checkpoint: where the next attempt resumes."""
        return self.state.latest()

    def checkpoint(self, record: CheckpointRecord) -> Checkpoint:
        """The committed checkpoint that ``record`` names."""
        return self.storage.checkpoint(record.dir_name)

    def set_status(self, status: RunStatus) -> None:
        """Record the run's status."""
        self._save(status=status, updated_at=time.time())

    def begin_attempt(self, index: int) -> None:
        """Record that attempt ``index`` starts (replacing a record of the same index)."""
        attempts = [a for a in self.state.attempts if a.index != index]
        attempts.append(AttemptRecord(index=index, started_at=time.time()))
        self._save(attempts=attempts, status="running", updated_at=time.time())

    def end_attempt(self, status: AttemptStatus, error: str | None) -> None:
        """Record how the current attempt ended (a no-op when it already has)."""
        attempts = list(self.state.attempts)
        if not attempts or attempts[-1].ended_at is not None:
            return
        attempts[-1] = attempts[-1].model_copy(
            update={"ended_at": time.time(), "status": status, "error": error}
        )
        self._save(attempts=attempts)

    def commit(
        self, index: int, dir_name: str, metrics: dict[str, Any]
    ) -> tuple[Checkpoint, list[str]]:
        """Commit the checkpoint of report ``index``; returns it and the dropped names.

        Once this returned, the checkpoint survives any failure. The checkpoints
        the retention policy dropped are no longer named by the state but are not
        deleted yet: the controller acknowledges the workers first (a SYNC report
        does not wait for deletions), then calls :meth:`delete_dropped`.

        Raises:
            CheckpointReportError: ``dir_name`` already names a committed checkpoint
                (names are unique in a run: a committed checkpoint never changes).
        """
        if dir_name in self.state.checkpoint_names():
            raise CheckpointReportError(
                f"report #{index}: checkpoint_dir_name={dir_name!r} already names a committed "
                "checkpoint of this run; checkpoint names must be unique in a run"
            )
        record = CheckpointRecord(
            dir_name=dir_name, metrics=metrics, report_index=index, created_at=time.time()
        )
        self.state, dropped = self.storage.commit_checkpoint(
            self.state, record, self.retention, delete_dropped=False
        )
        return self.storage.checkpoint(dir_name), dropped

    def delete_dropped(self, dir_names: list[str]) -> None:
        """Delete the checkpoints a commit dropped (see :meth:`commit`)."""
        if dir_names:
            self.storage.delete_checkpoints(dir_names)

    def delete_uncommitted(self) -> list[str]:
        """Delete checkpoint directories no committed state names; returns their names."""
        return self.storage.delete_uncommitted()

    def result(self, metrics: dict[str, Any]) -> Result:
        """The run's ``Result`` with ``metrics`` as its final metrics."""
        return result_from_state(self.storage, self.state, metrics=metrics)

    def _save(self, **update: Any) -> None:
        self.state = self.state.model_copy(update=update)
        self.storage.save_state(self.state)
