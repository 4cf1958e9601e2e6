"""Functions called inside the training function."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.train._internal.errors import TrainTypeError
from lumos.train._internal.report_config import (
    CheckpointConsistencyMode,
    CheckpointUploadMode,
    ReportedCheckpoint,
)
from lumos.train._internal.session import TrainContext, current_session

if TYPE_CHECKING:
    from lumos.storage import Checkpoint


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
) -> None:
    """Report metrics, and optionally a checkpoint, from every worker.

    Call it the same number of times on every rank. Without a checkpoint it
    returns at once (the metrics are queued for the driver). A checkpoint is
    registered when at least one rank passes one (ranks that save nothing pass
    ``checkpoint=None``, with or without the same ``checkpoint_dir_name``); the
    ranks' files merge into the run's ``checkpoint_dir_name`` directory (sharded
    checkpoints). It is committed once every rank reported it and every upload
    of it finished; commits happen in report order.

    SYNC (default) uploads this rank's files, then waits for the commit; ASYNC
    snapshots the directory and uploads it in the background (write it with
    ``tempfile.mkdtemp()``); NO_UPLOAD registers files already at
    ``<run>/<checkpoint_dir_name>``. See the package README.

    Args:
        metrics: JSON-serializable values (numbers, strings, lists, dicts; numpy
            scalars are fine, torch tensors are not: use ``.item()``); rank 0's are
            the run's metrics.
        checkpoint: a directory to save, e.g. ``Checkpoint.from_directory(d)``.
        checkpoint_dir_name: the checkpoint's directory name in the run: the same on
            every rank that passes a checkpoint, unique in the run. Default
            ``checkpoint_<index>`` (index of the report).
        checkpoint_upload_mode: ``train.CheckpointUploadMode`` SYNC, ASYNC or NO_UPLOAD.
        delete_local_checkpoint_after_upload: delete the local directory once
            uploaded; default True for ASYNC, False otherwise.
        checkpoint_upload_fn: ``fn(checkpoint, dir_name) -> Checkpoint`` uploads in
            place of lumos (SYNC or ASYNC); the returned checkpoint must be the run's
            ``<run>/<dir_name>`` directory. Your function owns the local files.

    Raises:
        NotInTrainingFunctionError: called outside a training function (a
            ``RuntimeError``).
        CheckpointReportError: ``checkpoint_dir_name`` is already used in this run,
            or a NO_UPLOAD / ``checkpoint_upload_fn`` checkpoint is not in the run's
            storage (a ``ValueError``).
        TrainTypeError: ``metrics`` is not a dict, holds a torch tensor or a value
            JSON cannot store (the message names the key); a ``TypeError``.

    Example:
        >>> ckpt = train.Checkpoint.from_directory(d) if rank == 0 else None  # doctest: +SKIP
        >>> train.report({"loss": loss.item()}, checkpoint=ckpt,  # doctest: +SKIP
        ...     checkpoint_dir_name=f"epoch={epoch}")
    """
    session = current_session("report")
    if not isinstance(metrics, dict):
        raise TrainTypeError(f"train.report(metrics) needs a dict, got {type(metrics).__name__}")
    mode, delete, upload_fn = (
        checkpoint_upload_mode,
        delete_local_checkpoint_after_upload,
        checkpoint_upload_fn,
    )
    session.report(metrics, checkpoint, checkpoint_dir_name, mode, delete, upload_fn)


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.COMMITTED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The run's committed checkpoints with their metrics, oldest first.

    Waits until the checkpoint this rank passed in its latest ``train.report()`` with a
    checkpoint is committed (an ASYNC upload may still run); a rank that passed none
    does not wait and sees the commits so far. Checkpoints that retention deleted are
    not listed. ``VALIDATED`` waits for the commit too (lumos runs no validation yet).

    Args:
        consistency_mode: ``train.CheckpointConsistencyMode`` COMMITTED or VALIDATED.
        timeout_s: Longest wait; ``None`` waits until the commit (or a stop).

    Raises:
        TimeoutError: the commit did not arrive within ``timeout_s``.

    Example:
        >>> for rc in train.get_all_reported_checkpoints():  # doctest: +SKIP
        ...     print(rc.checkpoint.path, rc.metrics, rc.status)
    """
    return current_session("get_all_reported_checkpoints").all_reported(consistency_mode, timeout_s)


def get_checkpoint() -> Checkpoint | None:
    """The run's latest committed checkpoint, or the trainer's ``resume_from_checkpoint``.

    The trainer's starting checkpoint is returned only while the run has no committed
    checkpoint of its own; ``None`` when there is neither.

    Example:
        >>> ckpt = train.get_checkpoint()  # doctest: +SKIP
        >>> if ckpt:
        ...     with ckpt.as_directory() as d:
        ...         model.load_state_dict(torch.load(f"{d}/model.pt"))
    """
    return current_session("get_checkpoint").checkpoint


def get_context() -> TrainContext:
    """Facts about this worker and run: ranks, world size, run name, storage.

    Example:
        >>> ctx = train.get_context()  # doctest: +SKIP
        >>> ctx.get_world_rank(), ctx.get_world_size()
        (0, 2)
    """
    return current_session("get_context").context
