"""Worker side of ``train.report`` / ``get_checkpoint`` / ``get_all_reported_checkpoints``.

One :class:`TrainSession` per rank and launch. It speaks the messages of ``wire.py``:

* every report is one ``emit``; a metrics-only report returns at once;
* SYNC (and NO_UPLOAD) reports with a checkpoint block until the driver's commit
  notice for that report; ASYNC reports return once the uploader took the snapshot;
* commit notices reach every rank: a rank reads them without blocking at each
  ``report()`` / ``get_checkpoint()``, so it knows the run's latest committed
  checkpoint and every committed name.

Checkpoint names are unique in a run (as in Ray): a name of a committed checkpoint,
or one this rank already passed in this attempt, is refused before any file is written.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from lumos.runtime import CurrentSlot, StopRequested
from lumos.train._internal import pending_saves, wire
from lumos.train._internal.data_positions import LoaderPositions
from lumos.train._internal.errors import CheckpointReportError, TrainConfigError, TrainTypeError
from lumos.train._internal.metrics_check import check_metrics
from lumos.train._internal.report_config import (
    CheckpointConsistencyMode,
    CheckpointUploadMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)
from lumos.train._internal.uploader import (
    Uploader,
    UploadJob,
    persist_job_upload,
    snapshot_directory,
    user_fn_upload,
)
from lumos.train._internal.validation import report_validation_arg

if TYPE_CHECKING:
    from lumos.runtime.worker import WorkerSession
    from lumos.storage import Checkpoint, RunStorage
    from lumos.train._internal.train_context import TrainContext, WorkerRunArgs
    from lumos.train._internal.validation import ValidationTaskConfig

_STATUS = {
    None: ReportedCheckpointStatus.COMMITTED,
    "pending": ReportedCheckpointStatus.PENDING_VALIDATION,
    "validated": ReportedCheckpointStatus.VALIDATED,
    "timeout": ReportedCheckpointStatus.VALIDATION_TIMEOUT,
    "failed": ReportedCheckpointStatus.VALIDATION_FAILED,
}
"""``ReportedCheckpoint.status`` of a stored ``CheckpointRecord.validation_status``."""

CURRENT: CurrentSlot[TrainSession] = CurrentSlot()
"""The training session of the calling thread (the user thread and the upload thread)."""

_DRAIN_EVERY = 1024
"""A metrics-only report without a name reads the commit notices only every this many
reports: the notices matter for names and ``get_checkpoint()``, which read them first."""

UploadFn = Callable[["Checkpoint", str], "Checkpoint"]


class UploadArgs(NamedTuple):
    """``train.report``'s upload arguments as passed; checked once a checkpoint comes."""

    mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    delete_local: bool | None = None
    upload_fn: UploadFn | None = None

    def delete(self) -> bool:
        """Whether the local directory goes once uploaded (the mode's default unless set)."""
        if self.delete_local is None:
            return self.mode.default_delete_local_checkpoint_after_upload()
        return self.delete_local


class TrainSession:
    """The training session of one rank (see the module docstring).

    Args:
        runtime_session: The runtime's session of this worker.
        context: What ``train.get_context()`` returns.
        args: The launch's ``WorkerRunArgs``.
    """

    def __init__(
        self, runtime_session: WorkerSession, context: TrainContext, args: WorkerRunArgs
    ) -> None:
        self.runtime = runtime_session
        self.context = context
        self.args = args
        self.next_index = args.report_index_base
        self._latest = args.checkpoint_dir_name
        self._latest_index = args.report_index_base - 1
        self._committed = set(args.committed_names)
        self._used: set[str] = set()  # names this rank passed in this attempt
        self._last_checkpoint_index = -1  # this rank's latest report with a checkpoint
        self._last_validation_index = -1  # ... and the latest that asked for a validation
        self._validated: set[int] = set()  # validation notices since then
        self._uploader: Uploader | None = None
        self.dataset_shards: dict[str, Any] = {}  # train.get_dataset_shard (datasets.py)
        # the data loaders of prepare_data_loader: positions sent with every report
        self.positions = LoaderPositions(
            context.get_storage,
            args.checkpoint_dir_name,
            context.get_world_rank(),
            context.get_world_size(),
        )

    # -- commit notices -----------------------------------------------------------------
    def _drain(self) -> None:
        """Read the commit notices that arrived, without blocking."""
        while True:
            try:
                value = self.runtime.receive(0.0)
            except (TimeoutError, StopRequested):  # nothing queued (a stop is seen elsewhere)
                return
            self._note(value)

    def _note(self, value: Any) -> int:
        notice = wire.decode_commit(value)
        if notice is None:
            validated = wire.decode_validated(value)
            if validated is None:  # pragma: no cover - protocol bug
                raise RuntimeError(f"lumos.train: unexpected message {value!r} from the driver")
            if validated[0] >= self._last_validation_index:
                self._validated.add(validated[0])
            return -1
        index, dir_name = notice
        self._committed.add(dir_name)
        if index > self._latest_index:
            self._latest, self._latest_index = dir_name, index
        return index

    def _wait_committed(self, index: int, timeout_s: float | None = None) -> None:
        """Block until report ``index``'s commit notice arrived (StopRequested on a stop)."""
        while self._latest_index < index:
            self._note(self.runtime.receive(timeout_s))

    # -- train.get_checkpoint / get_all_reported_checkpoints ------------------------------
    @property
    def checkpoint(self) -> Checkpoint | None:
        self._drain()
        if self._latest is not None:
            return self.context.get_storage().checkpoint(self._latest)
        return self.args.starting_checkpoint

    def all_reported(
        self, mode: CheckpointConsistencyMode, timeout_s: float | None
    ) -> list[ReportedCheckpoint]:
        if not isinstance(mode, CheckpointConsistencyMode):
            raise TrainTypeError(
                f"consistency_mode={mode!r} is not a train.CheckpointConsistencyMode "
                "(COMMITTED or VALIDATED)"
            )
        self._drain()
        self._wait_committed(self._last_checkpoint_index, timeout_s)
        if mode is CheckpointConsistencyMode.VALIDATED:
            wanted = self._last_validation_index
            while wanted >= 0 and wanted not in self._validated:
                self._note(self.runtime.receive(timeout_s))
        storage = self.context.get_storage()
        state = storage.load_state()
        return [
            ReportedCheckpoint(
                storage.checkpoint(r.dir_name), dict(r.metrics), _STATUS[r.validation_status]
            )
            for r in (state.live_checkpoints() if state is not None else [])
        ]

    # -- train.report -------------------------------------------------------------------
    def report(
        self,
        metrics: Any,
        checkpoint: Checkpoint | None,
        checkpoint_dir_name: str | None,
        upload: UploadArgs,
        validation: bool | ValidationTaskConfig,
    ) -> None:
        """``train.report()`` on this rank (``api.report`` documents it)."""
        if not isinstance(metrics, dict):
            raise TrainTypeError(
                f"train.report(metrics) needs a dict, got {type(metrics).__name__}"
            )
        request = report_validation_arg(validation)
        # a stop requested by the driver (restart, parent job, Ctrl-C) ends the function here
        self.runtime.raise_if_stop_requested()
        check_metrics(metrics)
        if request is not None and not self.args.has_validation:
            raise TrainConfigError(
                "train.report(validation=...) asks for a validation of the checkpoint, but "
                "the trainer has no validation function; pass "
                "TorchTrainer(..., validation_config=train.ValidationConfig(fn))"
            )
        metrics = dict(metrics)  # the user may change their dict after report() returned
        if checkpoint is None:
            self._report_metrics(metrics, checkpoint_dir_name, request)
        else:
            self._report_checkpoint(metrics, checkpoint, checkpoint_dir_name, upload, request)

    def _report_metrics(
        self, metrics: dict[str, Any], dir_name: str | None, validation: dict[str, Any] | None
    ) -> None:
        """A report without a checkpoint: queued for the driver, returns at once."""
        index = self.next_index
        if dir_name is not None:
            self._drain()
            self._claim(dir_name)
        elif not index % _DRAIN_EVERY:
            self._drain()  # the hot path reads notices only now and then (memory)
        self.next_index += 1
        positions = self.positions.snapshot()
        self.runtime.emit(
            wire.report_message(
                self.args.attempt, index, metrics, None, False, positions, validation
            )
        )

    def _report_checkpoint(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint,
        dir_name: str | None,
        upload: UploadArgs,
        validation: dict[str, Any] | None,
    ) -> None:
        """A report with a checkpoint: SYNC / NO_UPLOAD wait for its commit, ASYNC does not."""
        index = self.next_index
        self._drain()
        if not isinstance(upload.mode, CheckpointUploadMode):
            raise TrainTypeError(
                f"checkpoint_upload_mode={upload.mode!r} is not a train.CheckpointUploadMode "
                "(SYNC, ASYNC or NO_UPLOAD)"
            )
        name = self._claim(
            wire.default_checkpoint_dir_name(index) if dir_name is None else dir_name
        )
        try:
            if upload.mode is CheckpointUploadMode.ASYNC:
                self._report_async(index, metrics, checkpoint, name, upload, validation)
                return
            self._save_now(checkpoint, name, upload)
        except BaseException:
            self._used.discard(name)  # nothing was reported: the name stays free
            raise
        self._emit(index, metrics, name, pending=False, validation=validation)
        self._wait_committed(index)

    def _emit(
        self,
        index: int,
        metrics: dict[str, Any],
        dir_name: str,
        pending: bool,
        validation: dict[str, Any] | None = None,
    ) -> None:
        """Send a checkpoint report; from here on the report and its index are taken."""
        self.next_index = index + 1
        self._last_checkpoint_index = index
        if validation is not None:
            self._last_validation_index = index
            self._validated.clear()
        positions = self.positions.snapshot()
        self.runtime.emit(
            wire.report_message(
                self.args.attempt, index, metrics, dir_name, pending, positions, validation
            )
        )

    def _claim(self, name: str) -> str:
        """Validate ``name`` and refuse it when already used in this run; remember it."""
        from lumos.storage import validate_name

        validate_name(name, "checkpoint_dir_name")
        if name in self._committed or name in self._used:
            where = (
                "a committed checkpoint of this run"
                if name in self._committed
                else ("an earlier train.report() of this attempt")
            )
            raise CheckpointReportError(
                f"train.report(checkpoint_dir_name={name!r}): that name is already used by "
                f"{where}; checkpoint names must be unique in a run (e.g. "
                'f"epoch={epoch}"), so that a committed checkpoint never changes'
            )
        self._used.add(name)
        return name

    def _save_now(self, checkpoint: Checkpoint, dir_name: str, upload: UploadArgs) -> None:
        """SYNC / NO_UPLOAD: make the checkpoint's files be at ``<run>/<dir_name>``."""
        storage = self.context.get_storage()
        if checkpoint.is_local():  # a background save_sharded_state: its files first
            pending_saves.wait_now(checkpoint.path)
        if upload.mode is CheckpointUploadMode.NO_UPLOAD:
            check_in_run(storage, checkpoint, dir_name, "checkpoint_upload_mode=NO_UPLOAD")
            return
        if upload.upload_fn is not None:
            uploaded = upload.upload_fn(checkpoint, dir_name)
            check_in_run(storage, uploaded, dir_name, "checkpoint_upload_fn")
            return
        with checkpoint.as_directory() as local_dir:
            storage.persist_directory(local_dir, dir_name)
        if upload.delete() and checkpoint.is_local():
            shutil.rmtree(checkpoint.path, ignore_errors=True)

    def _report_async(
        self,
        index: int,
        metrics: dict[str, Any],
        checkpoint: Checkpoint,
        dir_name: str,
        upload: UploadArgs,
        validation: dict[str, Any] | None = None,
    ) -> None:
        """ASYNC: hand a snapshot (or the user's upload function) to the upload thread."""
        uploader = self._get_uploader()
        uploader.acquire()  # back-pressure: waits while MAX_UPLOADS_IN_FLIGHT are in flight
        storage = self.context.get_storage()

        def closed() -> bool:
            return uploader.closed

        try:
            wait = pending_saves.take(checkpoint.path) if checkpoint.is_local() else None
            if upload.upload_fn is not None:
                run_upload = user_fn_upload(
                    upload.upload_fn,
                    checkpoint,
                    dir_name,
                    lambda c, n: check_in_run(storage, c, n, "checkpoint_upload_fn"),
                )
                cleanup: list[str] = []
            elif wait is not None:  # save_sharded_state(async_save=True) still writes it
                # DCP's files, written once and deleted after the upload: linked, not copied
                delete = upload.delete()
                run_upload = persist_job_upload(storage, checkpoint.path, dir_name, closed, delete)
                cleanup = [checkpoint.path] if delete else []
            else:
                snap = (
                    snapshot_directory(checkpoint.path)
                    if checkpoint.is_local()
                    else checkpoint.to_directory()
                )
                run_upload = persist_job_upload(storage, snap, dir_name, closed)
                delete = upload.delete() and checkpoint.is_local()
                cleanup = [snap] + ([checkpoint.path] if delete else [])
            if wait is not None:
                run_upload = pending_saves.upload_after_save(wait, run_upload, dir_name, closed)
        except BaseException:
            uploader.release()
            raise
        self._emit(index, metrics, dir_name, pending=True, validation=validation)
        uploader.submit(UploadJob(index, dir_name, run_upload, cleanup))

    def _get_uploader(self) -> Uploader:
        if self._uploader is None:
            self._uploader = Uploader(
                self._upload_done, lambda: self.runtime.stop_requested, self._activate
            )
        return self._uploader

    def _activate(self, on: bool) -> None:
        if on:
            CURRENT.activate(self)
        else:
            CURRENT.deactivate(self)

    def _upload_done(self, job: UploadJob, error: BaseException | None) -> None:
        remote = None
        if error is not None:
            from lumos.runtime import RemoteError

            remote = RemoteError.from_exception(error, rank=self.context.get_world_rank())
        self.runtime.emit(wire.uploaded_message(self.args.attempt, job.index, job.dir_name, remote))

    def end(self, ok: bool) -> None:
        """The training function ended: finish (``ok``) or cancel the background uploads."""
        uploader = self._uploader
        if uploader is None:
            return
        if ok:
            while not uploader.wait_idle(0.2):  # the driver commits them before finishing
                self.runtime.raise_if_stop_requested()
            uploader.close(cancel=False)
            return
        uploader.close(cancel=True)
        uploader.wait_idle(10.0)  # an upload of ours must not write into the next attempt


def check_in_run(storage: RunStorage, checkpoint: Any, dir_name: str, what: str) -> None:
    """Raise ``CheckpointReportError`` unless ``checkpoint`` is the run's ``dir_name`` directory."""
    from lumos.storage import Checkpoint, retried_exists

    expected = storage.checkpoint(dir_name)
    if not isinstance(checkpoint, Checkpoint):
        raise CheckpointReportError(
            f"{what} must give a train.Checkpoint at {expected.uri!r}, got {checkpoint!r}"
        )
    if checkpoint.uri.rstrip("/") != expected.uri.rstrip("/"):
        raise CheckpointReportError(
            f"{what}: the checkpoint must already be in the run's storage at "
            f"{expected.uri!r} (<run>/<checkpoint_dir_name>), but it is at {checkpoint.uri!r}"
        )
    if not retried_exists(expected.filesystem, expected.path):
        raise CheckpointReportError(
            f"{what}: nothing was written to {expected.uri!r}; save the checkpoint there "
            "before train.report() registers it"
        )
