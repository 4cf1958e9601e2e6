"""Functions called inside the training function."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lumos.train._internal.errors import TrainTypeError
from lumos.train._internal.session import TrainContext, current_session

if TYPE_CHECKING:
    from lumos.storage import Checkpoint


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
) -> None:
    """Report metrics, and optionally a checkpoint, from every worker.

    Call it the same number of times on every rank. Without a checkpoint it
    returns at once (the metrics are queued for the driver). With a
    checkpoint, this rank's files are uploaded into the run's
    ``checkpoint_dir_name`` directory (ranks' files merge: sharded
    checkpoints), then the call waits until every rank has reported and the
    driver has committed the checkpoint: once ``report()`` returned on every
    rank, a failure cannot lose that checkpoint.

    Args:
        metrics: JSON-serializable values; rank 0's are the run's metrics.
        checkpoint: a directory to save, e.g. ``Checkpoint.from_directory(tmp)``.
        checkpoint_dir_name: the checkpoint's directory name in the run; the
            same on every rank. Default ``checkpoint_<index>`` (index of the report).

    Ranks that report different ``checkpoint_dir_name`` values for one report, or
    a rank that returns without reporting a checkpoint the others reported, end
    the run: ``fit()`` raises ``TrainingFailedError`` naming the ranks and names.

    Raises:
        NotInTrainingFunctionError: called outside a training function (a
            ``RuntimeError``).
        CheckpointReportError: ``checkpoint_dir_name`` without a checkpoint (a
            ``ValueError``).
        TypeError: ``metrics`` is not a dict.

    Example:
        >>> with tempfile.TemporaryDirectory() as d:  # doctest: +SKIP
        ...     torch.save(model.state_dict(), f"{d}/model.pt")
        ...     train.report({"loss": loss}, checkpoint=train.Checkpoint.from_directory(d))
    """
    session = current_session("report")
    if not isinstance(metrics, dict):
        raise TrainTypeError(f"train.report(metrics) needs a dict, got {type(metrics).__name__}")
    session.report(metrics, checkpoint, checkpoint_dir_name)


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint of the run (after a restart or a resume), or ``None``.

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
