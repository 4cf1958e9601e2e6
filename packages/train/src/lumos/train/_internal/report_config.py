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
        VALIDATED: until it is validated. lumos runs no checkpoint validation yet, so
            this waits for the commit too (the same as COMMITTED).

    Example:
        >>> CheckpointConsistencyMode("COMMITTED") is CheckpointConsistencyMode.COMMITTED
        True
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(Enum):
    """The state of a reported checkpoint (Ray's members).

    lumos produces only ``COMMITTED`` until checkpoint validation lands; the other
    members exist so that code written for Ray compares against them unchanged.

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
        metrics: Rank 0's metrics of the report that carried it.
        status: Always ``ReportedCheckpointStatus.COMMITTED`` for now.

    Example:
        >>> for rc in train.get_all_reported_checkpoints():  # doctest: +SKIP
        ...     print(rc.checkpoint.path, rc.metrics["loss"])
    """

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus
