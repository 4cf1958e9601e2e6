"""RunBook: the run's stored state (status, attempts, committed checkpoints).

Every change builds a new ``RunState`` and saves it through ``RunStorage``
before the controller goes on, so the stored state is always what a resumed
run (``fit()`` again with the same ``RunConfig(storage_path, name)``) starts from.
Checkpoint commits go through ``RunStorage.commit_checkpoint``, which writes the
new state before it deletes what the retention policy drops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from lumos.storage import (
    AttemptRecord,
    Checkpoint,
    CheckpointRecord,
    FailureRecord,
    RetentionPolicy,
    RollbackRecord,
    RunState,
    RunStorage,
    WorkerRecord,
)
from lumos.train._internal.errors import CheckpointReportError
from lumos.train._internal.result import Result, result_from_state

RunStatus = Literal["running", "finished", "errored", "aborted"]
AttemptStatus = Literal["finished", "errored", "aborted", "rolled_back", "resized"]
EndedBy = Literal["failure", "hang", "preemption", "resize", "rollback"]
ROLLED_BACK_SUFFIX = ".rolled-back-"
"""A rolled-back checkpoint's directory becomes ``<name>.rolled-back-<number>``, so
that the resumed run may report under its old name again."""


TRAINING_FINISHED = "training_finished"
"""``RunState.extra`` key: every rank returned; a resumed run only finishes what is left."""


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

    @property
    def training_finished(self) -> bool:
        """Every rank's function returned; only outstanding work (validations) is left."""
        return bool(self.state.extra.get(TRAINING_FINISHED))

    def mark_training_finished(self, done: bool) -> None:
        """Record that training finished (or, after a rollback, that it goes on: the
        mark goes, as it never was)."""
        if self.training_finished != done:
            self._save(extra=self._extra_marked(done), updated_at=time.time())

    def finish(self) -> None:
        """Record that the run finished. The training-finished mark (only validations
        were left) goes with it: whether the last validations outlived the ranks is
        timing, not part of the finished run's record."""
        self._save(status="finished", extra=self._extra_marked(False), updated_at=time.time())

    def _extra_marked(self, done: bool) -> dict[str, Any]:
        extra = {k: v for k, v in self.state.extra.items() if k != TRAINING_FINISHED}
        return {**extra, TRAINING_FINISHED: True} if done else extra

    def begin_attempt(
        self, index: int, restart: str | None = None, workers: Sequence[WorkerRecord] = ()
    ) -> None:
        """Record that attempt ``index`` starts (replacing a record of the same index),
        how it started and where its ranks run."""
        attempts = [a for a in self.state.attempts if a.index != index]
        record = AttemptRecord(index=index, restart=restart, workers=list(workers))
        attempts.append(record)
        self._save(attempts=attempts, status="running", updated_at=time.time())

    def end_attempt(
        self,
        status: AttemptStatus,
        error: str | None,
        failures: Sequence[FailureRecord] = (),
        ended_by: EndedBy | None = None,
    ) -> None:
        """Record how the current attempt ended (a no-op when it already has): its
        status, error text, each failure's rank and node, and the event that ended it."""
        attempts = list(self.state.attempts)
        if not attempts or attempts[-1].ended_at is not None:
            return
        update: dict[str, Any] = {"ended_at": time.time(), "status": status, "error": error}
        update |= {"failures": list(failures), "ended_by": ended_by}
        attempts[-1] = attempts[-1].model_copy(update=update)
        self._save(attempts=attempts)

    def commit(
        self,
        index: int,
        dir_name: str,
        metrics: dict[str, Any],
        validation_request: dict[str, Any] | None = None,
    ) -> tuple[Checkpoint, list[str]]:
        """Commit the checkpoint of report ``index``; returns it and the dropped names.

        Once this returned, the checkpoint survives any failure. The checkpoints
        the retention policy dropped are no longer named by the state but are not
        deleted yet: the controller acknowledges the workers first (a SYNC report
        does not wait for deletions), then calls :meth:`delete_dropped`.

        With ``validation_request`` the checkpoint is committed with its validation
        pending: retention does not judge it until :meth:`record_validation`.

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
            dir_name=dir_name,
            metrics=metrics,
            report_index=index,
            created_at=time.time(),
            validation_status=None if validation_request is None else "pending",
            validation_request=validation_request,
        )
        self.state, dropped = self.storage.commit_checkpoint(
            self.state, record, self.retention, delete_dropped=False
        )
        return self.storage.checkpoint(dir_name), dropped

    def pending_validations(self) -> list[CheckpointRecord]:
        """Checkpoints (not rolled back) whose validation has not ended, oldest first."""
        return [r for r in self.state.live_checkpoints() if r.validation_pending]

    def record_validation(
        self,
        dir_name: str,
        status: Literal["validated", "timeout", "failed"],
        metrics: dict[str, Any],
        error: str | None,
    ) -> tuple[CheckpointRecord | None, list[str]]:
        """Merge a validation's outcome into checkpoint ``dir_name``, then apply retention.

        The metrics go into the history before the state says "validated": a driver
        killed in between leaves the validation pending, and the rerun runs it again
        (its merge is the same), never a validated checkpoint whose history row lacks
        its metrics.

        Returns:
            ``(updated record or None when the checkpoint is gone, dropped names)``;
            the dropped directories are not deleted yet (:meth:`delete_dropped`).
        """
        records = list(self.state.checkpoints)
        at = next((i for i, r in enumerate(records) if r.dir_name == dir_name), None)
        if at is None:
            return None, []
        old = records[at]
        if status == "validated" and metrics:
            self.storage.merge_metrics(old.report_index, metrics)
        records[at] = old.model_copy(
            update={
                "metrics": {**old.metrics, **metrics},
                "validation_status": status,
                "validation_request": None,
                "validation_error": error,
            }
        )
        self.state, dropped = self.storage.update_checkpoints(
            self.state, records, self.state.latest_checkpoint, self.retention, delete_dropped=False
        )
        return records[at], dropped

    def rollback(
        self,
        check: str,
        reason: str,
        from_report: int,
        target: CheckpointRecord | None,
        metrics: dict[str, Any],
    ) -> tuple[RollbackRecord, list[str]]:
        """Roll the run back to ``target`` (``None``: to the start).

        Every checkpoint (not rolled back already) reported after ``target`` is marked
        rolled back: never resumed from again, dropped first by retention, and renamed
        ``<name>.rolled-back-<number>`` so the resumed run may use its name again. A
        pending validation of one of them is recorded as failed. The state is written
        before any directory moves; :meth:`settle_rollbacks` finishes the renames
        (also after a crash).

        Returns:
            ``(the rollback's record, dropped names)`` (dropped: not deleted yet).
        """
        number = len(self.state.rollbacks) + 1
        after = -1 if target is None else target.report_index
        records: list[CheckpointRecord] = []
        renamed: list[str] = []
        for r in self.state.checkpoints:
            if r.rolled_back or r.report_index <= after:
                records.append(r)
                continue
            update: dict[str, Any] = {"rolled_back": True}
            if r.validation_pending:
                update.update(
                    validation_status="failed",
                    validation_request=None,
                    validation_error="cancelled: the checkpoint was rolled back",
                )
            records.append(r.model_copy(update=update))
            renamed.append(f"{r.dir_name}{ROLLED_BACK_SUFFIX}{number}")
        record = RollbackRecord(
            number=number,
            check=check,
            reason=reason,
            from_report=from_report,
            to_checkpoint=None if target is None else target.dir_name,
            to_report_index=None if target is None else target.report_index,
            rolled_back=renamed,
            metrics=metrics,
        )
        self.state, dropped = self.storage.update_checkpoints(
            self.state,
            records,
            None if target is None else target.dir_name,
            self.retention,
            delete_dropped=False,
            rollbacks=[*self.state.rollbacks, record],
        )
        self.settle_rollbacks()
        return record, dropped

    def settle_rollbacks(self) -> None:
        """Rename the rolled-back checkpoints that still have their reported name."""
        final: dict[str, str] = {}
        for rb in self.state.rollbacks:
            for name in rb.rolled_back:
                final[name.rsplit(ROLLED_BACK_SUFFIX, 1)[0]] = name
        records = list(self.state.checkpoints)
        changed = False
        for i, r in enumerate(records):
            new = final.get(r.dir_name) if r.rolled_back else None
            if new is None or new == r.dir_name:
                continue
            self.storage.rename_checkpoint(r.dir_name, new)
            records[i] = r.model_copy(update={"dir_name": new})
            changed = True
        if changed:
            self._save(checkpoints=records, updated_at=time.time())

    def delete_dropped(self, dir_names: list[str]) -> None:
        """Delete the checkpoints a commit dropped (see :meth:`commit`)."""
        if dir_names:
            self.storage.delete_checkpoints(dir_names)

    def delete_uncommitted(self) -> list[str]:
        """Delete checkpoint directories no committed state names; returns their names."""
        return self.storage.delete_uncommitted()

    def result(self, metrics: dict[str, Any] | None = None) -> Result:
        """The run's ``Result``; its final metrics are ``metrics``, by default the
        history's last row (the same whichever driver ran the last report)."""
        return result_from_state(self.storage, self.state, metrics=metrics)

    def _save(self, **update: Any) -> None:
        self.state = self.state.model_copy(update=update)
        self.storage.save_state(self.state)
