"""``ReportCallback``: Lightning's metrics and checkpoint through ``train.report``; resume.

At the end of every ``every_n_epochs``-th training epoch (after that epoch's
validation), every rank saves the Lightning checkpoint into a fresh local directory
(``trainer.save_checkpoint``: a collective; under DDP only rank 0 writes the file;
under ``LumosModelParallelStrategy`` ``checkpoint.ckpt`` is a folder and every rank
writes its DCP shard into its own, rank 0 also the metadata) and calls ``train.report`` with
``trainer.callback_metrics`` as floats plus ``epoch`` and ``step``. A rank that wrote
files passes them as the checkpoint, the others pass none: lumos merges the ranks'
files into one checkpoint directory of the run (``checkpoint.ckpt`` inside). SYNC
reports return once the checkpoint is committed (so no barrier is needed) and the
local copy is then deleted; ASYNC leaves the upload and the deletion to lumos.

:func:`get_checkpoint_path` turns the run's latest checkpoint into the ``ckpt_path``
that ``trainer.fit`` resumes from.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from lumos.storage import Checkpoint
from lumos.train._internal.api import get_checkpoint, report
from lumos.train._internal.errors import TrainConfigError, TrainTypeError
from lumos.train._internal.report_config import CheckpointUploadMode
from lumos.train._internal.validation import ValidationTaskConfig

CHECKPOINT_NAME = "checkpoint.ckpt"
"""The Lightning checkpoint's file name inside a lumos checkpoint (Ray Train's too)."""


class ReportCallback(pl.Callback):
    """Report ``trainer.callback_metrics`` and the Lightning checkpoint to lumos.

    Ray Train's ``RayTrainReportCallback`` (also exported under that name). At the end
    of every ``every_n_epochs``-th training epoch, after its validation, it reports
    every value of ``trainer.callback_metrics`` as a float, plus ``epoch`` (0-based)
    and ``step`` (``trainer.global_step``), with a checkpoint holding
    ``checkpoint.ckpt`` (:attr:`CHECKPOINT_NAME`), the full Lightning checkpoint
    (model, optimizers, loops, callbacks), which ``trainer.fit(ckpt_path=...)`` resumes
    from. Checkpoints take the run's default names (``checkpoint_<index>``).

    Args:
        checkpoint_upload_mode: ``train.CheckpointUploadMode.SYNC`` (default, also for
            ``None``: the report returns once the checkpoint is committed) or ``ASYNC``
            (uploaded in the background while training goes on).
        validation: As ``train.report(validation=...)``: ``True`` or a
            ``train.ValidationTaskConfig`` runs the trainer's ``ValidationConfig``
            function on each reported checkpoint.
        every_n_epochs: Report every n-th epoch (epochs ``n-1``, ``2n-1``, ...); 1 by
            default, as Ray.

    Raises:
        TrainConfigError: ``every_n_epochs`` is not a positive int, or the upload mode
            is ``NO_UPLOAD`` (a ``ValueError``).
        TrainTypeError: ``checkpoint_upload_mode`` or ``validation`` has the wrong type.

    Example:
        >>> trainer = pl.Trainer(max_epochs=5, strategy=LumosDDPStrategy(),  # doctest: +SKIP
        ...     plugins=[LumosLightningEnvironment()], callbacks=[ReportCallback()])
        >>> trainer = prepare_trainer(trainer)  # doctest: +SKIP
        >>> with get_checkpoint_path() as ckpt_path:  # doctest: +SKIP
        ...     trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(
        self,
        checkpoint_upload_mode: CheckpointUploadMode | None = None,
        validation: bool | ValidationTaskConfig = False,
        every_n_epochs: int = 1,
    ) -> None:
        super().__init__()
        mode = (
            CheckpointUploadMode.SYNC if checkpoint_upload_mode is None else checkpoint_upload_mode
        )
        if not isinstance(mode, CheckpointUploadMode):
            raise TrainTypeError(
                f"ReportCallback(checkpoint_upload_mode={checkpoint_upload_mode!r}): pass "
                "train.CheckpointUploadMode.SYNC or ASYNC"
            )
        if mode is CheckpointUploadMode.NO_UPLOAD:
            raise TrainConfigError(
                "ReportCallback(checkpoint_upload_mode=NO_UPLOAD): the callback writes the "
                "Lightning checkpoint to a local directory, which lumos must upload; pass "
                "train.CheckpointUploadMode.SYNC (default) or ASYNC"
            )
        if not isinstance(validation, bool | ValidationTaskConfig):
            raise TrainTypeError(
                f"ReportCallback(validation={validation!r}): pass True, False or a "
                "train.ValidationTaskConfig"
            )
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int):
            raise TrainConfigError(
                f"ReportCallback(every_n_epochs={every_n_epochs!r}): pass an int >= 1"
            )
        if every_n_epochs < 1:
            raise TrainConfigError(
                f"ReportCallback(every_n_epochs={every_n_epochs}): pass an int >= 1 "
                "(1 reports at the end of every epoch)"
            )
        self.checkpoint_upload_mode = mode
        self.validation = validation
        self.every_n_epochs = every_n_epochs

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Save the checkpoint and report it with the metrics (every rank)."""
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs:
            return
        metrics = float_metrics(trainer.callback_metrics)
        metrics["epoch"] = epoch
        metrics["step"] = trainer.global_step
        tmpdir = tempfile.mkdtemp(prefix=f"lumos-lightning-epoch={epoch}-")
        asynchronous = self.checkpoint_upload_mode is CheckpointUploadMode.ASYNC
        handed_over = False
        try:
            trainer.save_checkpoint(os.path.join(tmpdir, CHECKPOINT_NAME), weights_only=False)
            wrote = bool(os.listdir(tmpdir))  # under DDP, ranks > 0 write nothing
            report(
                metrics,
                checkpoint=Checkpoint.from_directory(tmpdir) if wrote else None,
                checkpoint_upload_mode=self.checkpoint_upload_mode,
                delete_local_checkpoint_after_upload=True if asynchronous else None,
                validation=self.validation,
            )
            handed_over = asynchronous and wrote  # lumos deletes it after the upload
        finally:
            if not handed_over:
                shutil.rmtree(tmpdir, ignore_errors=True)


def float_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``trainer.callback_metrics`` as plain floats (one-element tensors and numbers).

    Raises:
        TrainTypeError: a value is a tensor of more than one element, or not a number.
    """
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TrainTypeError(
                    f"trainer.callback_metrics[{key!r}] is a tensor of shape "
                    f"{tuple(value.shape)}; ReportCallback reports one-element values "
                    "(log a scalar with self.log)"
                )
            out[key] = float(value.detach().item())
        elif isinstance(value, numbers.Real):
            out[key] = float(value)
        else:
            raise TrainTypeError(
                f"trainer.callback_metrics[{key!r}] = {value!r} is a "
                f"{type(value).__name__}; ReportCallback reports numbers"
            )
    return out


@contextlib.contextmanager
def get_checkpoint_path() -> Iterator[str | None]:
    """The Lightning checkpoint to resume from: ``trainer.fit(..., ckpt_path=...)``.

    Yields the local path of ``checkpoint.ckpt`` inside ``train.get_checkpoint()`` (the
    run's latest committed checkpoint, or the trainer's ``resume_from_checkpoint``),
    or ``None`` when there is none, so the same code starts fresh or resumes. For a
    sharded checkpoint (``LumosModelParallelStrategy``) it is the folder of every rank's
    DCP shards, which Lightning loads into the model as it is sharded now.
    A checkpoint on remote storage is downloaded for the duration of the block: run
    ``trainer.fit`` inside it (Lightning reads the file when the fit starts).

    Raises:
        FileNotFoundError: the checkpoint holds no ``checkpoint.ckpt`` (it was not
            written by ``ReportCallback``); the message lists what it holds.
        NotInTrainingFunctionError: called outside a training function.

    Example:
        >>> with get_checkpoint_path() as ckpt_path:  # doctest: +SKIP
        ...     trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    """
    checkpoint = get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, CHECKPOINT_NAME)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"checkpoint {checkpoint.path!r} holds no {CHECKPOINT_NAME!r} (files: "
                f"{sorted(os.listdir(directory))}); get_checkpoint_path() reads checkpoints "
                "that lumos.train.lightning.ReportCallback reported"
            )
        yield path


RayTrainReportCallback = ReportCallback
"""Ray Train's name of :class:`ReportCallback`."""
