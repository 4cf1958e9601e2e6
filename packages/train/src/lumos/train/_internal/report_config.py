"""How ``train.report()`` saves a checkpoint and what ``get_all_reported_checkpoints`` returns.

The names and members are Ray Train V2's (``ray.train.CheckpointUploadMode`` & co.),
so code written for Ray reads the same here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lumos.storage import Checkpoint


class CheckpointUploadMode(Enum):
    """How ``train.report(..., checkpoint_upload_mode=...)`` stores a checkpoint.

    Members:
        SYNC: ``report()`` uploads the files, then waits until the checkpoint is
            committed (every rank reported it).
        ASYNC: ``report()`` snapshots the directory (hard links) and returns; a
            background thread of the worker uploads it. The checkpoint commits once
            every rank's upload finished, in report order.
        NO_UPLOAD: the checkpoint already sits in the run's storage at
            ``<run>/<checkpoint_dir_name>`` (e.g. written there by
            ``torch.distributed.checkpoint``); nothing is copied.

    Example:
        >>> CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
        True
    """

    ASYNC = "ASYNC"
    SYNC = "SYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Whether the local directory is deleted after its upload by default (ASYNC only)."""
        return self == CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(Enum):
    """What ``train.get_all_reported_checkpoints()`` waits for.

    Members:
        COMMITTED: until the checkpoint of this rank's latest ``report()`` is committed.
        VALIDATED: until it is committed and the validation it asked for (if any,
            ``train.report(..., validation=True)``) ended.

    Example:
        >>> CheckpointConsistencyMode("COMMITTED") is CheckpointConsistencyMode.COMMITTED
        True
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(Enum):
    """The state of a reported checkpoint (Ray's members).

    ``COMMITTED``: no validation was asked for; ``PENDING_VALIDATION``: it runs or
    waits to run; ``VALIDATED``: its metrics are merged into the checkpoint's;
    ``VALIDATION_TIMEOUT`` / ``VALIDATION_FAILED``: it exceeded its ``timeout_s`` or
    raised (training went on).

    Example:
        >>> ReportedCheckpointStatus.COMMITTED.value
        'COMMITTED'
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A committed checkpoint of the run and the metrics reported with it.

    Attributes:
        checkpoint: The checkpoint in the run's storage.
        metrics: Rank 0's metrics of the report that carried it, with its
            validation's metrics merged in.
        status: Where the checkpoint's validation stands (``ReportedCheckpointStatus``).

    Example:
        >>> for rc in train.get_all_reported_checkpoints():  # doctest: +SKIP
        ...     print(rc.checkpoint.path, rc.metrics["loss"])
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus
