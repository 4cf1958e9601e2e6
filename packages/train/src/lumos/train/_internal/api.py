"""Functions called inside the training function."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.train._internal.report_config import (
    CheckpointConsistencyMode,
    CheckpointUploadMode,
    ReportedCheckpoint,
)
from lumos.train._internal.reporting import UploadArgs
from lumos.train._internal.session import current_session
from lumos.train._internal.train_context import TrainContext
from lumos.train._internal.validation import ValidationTaskConfig

if TYPE_CHECKING:
    from lumos.runtime import PreemptionInfo
    from lumos.storage import Checkpoint


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: bool | ValidationTaskConfig = False,
) -> None:
    """Report metrics, and optionally a checkpoint, from every worker.

    Call it the same number of times on every rank. Without a checkpoint it returns at
    once (the metrics are queued for the driver). A checkpoint is registered when at least
    one rank passes one (ranks that save nothing pass ``checkpoint=None``, with or without
    the same ``checkpoint_dir_name``); the ranks' files merge into the run's
    ``checkpoint_dir_name`` directory (sharded checkpoints). It is committed once every rank
    reported it and every upload of it finished; commits happen in report order.

    Args:
        metrics: JSON-serializable values (numbers, strings, lists, dicts; numpy scalars are
            fine, torch tensors are not: use ``.item()``); rank 0's are the run's metrics.
        checkpoint: a directory to save, e.g. ``Checkpoint.from_directory(d)``.
        checkpoint_dir_name: the checkpoint's directory name in the run: the same on every
            rank that passes a checkpoint, unique in the run. Default ``checkpoint_<index>``
            (index of the report).
        checkpoint_upload_mode: a ``train.CheckpointUploadMode``. SYNC (default) uploads this
            rank's files, then waits for the commit; ASYNC snapshots the directory and
            uploads it in the background (write it with ``tempfile.mkdtemp()``); NO_UPLOAD
            registers files already at ``<run>/<checkpoint_dir_name>``. See docs/guide/checkpoints.md.
        delete_local_checkpoint_after_upload: delete the local directory once uploaded;
            default True for ASYNC, False otherwise.
        checkpoint_upload_fn: ``fn(checkpoint, dir_name) -> Checkpoint`` uploads in place of
            lumos (SYNC or ASYNC); the returned checkpoint must be the run's
            ``<run>/<dir_name>`` directory. Your function owns the local files.
        validation: ``True`` runs the trainer's ``ValidationConfig`` function on this report's
            checkpoint once it is committed, as its own Ray task, while training goes on; a
            ``train.ValidationTaskConfig`` also overrides its ``fn_kwargs`` / ``timeout_s``
            for this report. Ignored when no rank passes a checkpoint.

    Raises:
        NotInTrainingFunctionError: called outside a training function (a ``RuntimeError``).
        CheckpointReportError: ``checkpoint_dir_name`` is already used in this run, or a
            NO_UPLOAD / ``checkpoint_upload_fn`` checkpoint is not in the run's storage (a
            ``ValueError``).
        TrainConfigError: ``validation`` is asked for but the trainer has no
            ``validation_config`` (a ``ValueError``).
        TrainTypeError: ``metrics`` is not a dict, holds a torch tensor or a value JSON
            cannot store (the message names the key); a ``TypeError``.

    Example:
        >>> ckpt = train.Checkpoint.from_directory(d) if rank == 0 else None  # doctest: +SKIP
        >>> train.report({"loss": loss.item()}, checkpoint=ckpt,  # doctest: +SKIP
        ...     checkpoint_dir_name=f"epoch={epoch}")
    """
    session = current_session("report")
    upload = UploadArgs(
        checkpoint_upload_mode, delete_local_checkpoint_after_upload, checkpoint_upload_fn
    )
    session.report(metrics, checkpoint, checkpoint_dir_name, upload, validation)


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.COMMITTED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The run's committed checkpoints with their metrics, oldest first.

    Waits until the checkpoint this rank passed in its latest ``train.report()`` with a
    checkpoint is committed (an ASYNC upload may still run); a rank that passed none
    does not wait and sees the commits so far. Checkpoints that retention deleted are
    not listed, nor are checkpoints a health check rolled back. ``VALIDATED`` also waits
    until the validation this rank's latest report asked for (if any) has ended; each
    checkpoint's ``status`` says where its validation stands, and a validation's
    metrics are merged into ``metrics``.

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


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's part of the trainer's dataset ``dataset_name`` (a ``ray.data.DataIterator``).

    A dataset that ``DataConfig(datasets_to_split=...)`` splits (all, by default) is
    divided across the workers in equal shares; any other is given whole to every
    worker. Each ``iter_torch_batches()`` / ``iter_batches()`` loop over the shard is
    one epoch. The shards are rebuilt for the group's world size at every start of
    the group (restart after a failure, job-level restore).

    Args:
        dataset_name: A key of the trainer's ``datasets=``; may be left out when it
            has only one.

    Raises:
        KeyError: the trainer has no dataset of that name (the message lists them).

    Example:
        >>> shard = train.get_dataset_shard("train")  # doctest: +SKIP
        >>> for epoch in range(2):
        ...     for batch in shard.iter_torch_batches(batch_size=1024):
        ...         ...
    """
    from lumos.train._internal.datasets import dataset_shard

    return dataset_shard(current_session("get_dataset_shard").dataset_shards, dataset_name)


def get_preemption_info() -> PreemptionInfo | None:
    """An imminent preemption of some of the run's workers, or ``None``.

    Set when Ray marks a node of the run as draining (the autoscaler, a spot
    termination notice, ``ray drain-node``) or a worker process gets SIGTERM. Save a
    checkpoint before ``deadline_ms``: right after it commits, the affected ranks
    move (an elastic run drops them or refills elsewhere; a fixed-size run starts
    anew off the draining nodes) and training resumes from it, with no reported step
    lost. Ray Train's ``PreemptionInfo``: ``deadline_ms`` (UNIX ms, or ``None``) and
    ``preempted_node_to_ranks``.

    Example:
        >>> info = train.get_preemption_info()  # doctest: +SKIP
        >>> if info is not None:  # checkpoint now, then keep going
        ...     train.report(metrics, checkpoint=save(), checkpoint_dir_name=f"step={step}")
    """
    return current_session("get_preemption_info").runtime.preemption_info()


def get_context() -> TrainContext:
    """Facts about this worker and run: ranks, world size, run name, storage.

    Example:
        >>> ctx = train.get_context()  # doctest: +SKIP
        >>> ctx.get_world_rank(), ctx.get_world_size()
        (0, 2)
    """
    return current_session("get_context").context
