"""Hugging Face Transformers: report a ``transformers.Trainer``'s logs and checkpoints.

:class:`ReportCallback` is a ``transformers.TrainerCallback``. Logs (``on_log``) are
merged per optimizer step and reported once the step is over (at the next step, epoch
or the end of training), so one step gives at most one report on every rank. A
checkpoint the Trainer saved (``on_save``) is reported with the latest value of every
logged metric (Ray's ``RayTrainReportCallback``), in Ray's layout: the Trainer's
``checkpoint-<step>`` folder as ``checkpoint/`` inside a lumos checkpoint of the same
name. Each rank uploads only its own files: rank 0 the folder but for the other
ranks' RNG states, every other rank its ``rng_state_<rank>.pth`` (which, on another
node, only it has); the files merge in the run's checkpoint.

:func:`prepare_trainer` lets the Trainer read a Ray Data shard
(``train.get_dataset_shard(...).iter_torch_batches()``) and checks that the Trainer
joined the process group lumos started in the worker: ``TrainingArguments`` reads
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` (set by the torch backend)
and accelerate uses the already initialised default group instead of starting one.

``transformers`` and ``accelerate`` are the ``lumos-train[transformers]`` extra.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, IterableDataset

from lumos.train._internal.errors import TrainConfigError, TrainTypeError
from lumos.train._internal.extras import require_extra

require_extra(  # an ImportError naming the extra, before the imports below
    "transformers",
    "transformers",
    "lumos.train.huggingface.transformers",
    "Hugging Face Transformers and accelerate",
)
import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

#: The Hugging Face checkpoint's folder inside a reported lumos checkpoint (Ray's name).
CHECKPOINT_NAME = "checkpoint"
_RNG_FILE = re.compile(r"rng_state_(\d+)\.pth")


def _owned_files(folder: str, rank: int) -> list[str]:
    """The files of the Trainer's checkpoint ``folder`` that ``rank`` uploads."""
    out = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            per_rank = _RNG_FILE.fullmatch(name)
            owner = int(per_rank.group(1)) if per_rank else 0
            if owner == rank:
                out.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(out)


def _latest(state: TrainerState) -> dict[str, Any]:
    """The latest value of every metric the Trainer logged."""
    metrics: dict[str, Any] = {}
    for entry in state.log_history:
        metrics.update(entry)
    return metrics


def _link_or_copy(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)  # no copy of the weights; the upload only reads it
    except OSError:
        shutil.copy2(src, dst)


class ReportCallback(TrainerCallback):
    """Reports a ``transformers.Trainer``'s metrics and checkpoints to lumos.

    Add it to the Trainer (``callbacks=[ReportCallback()]`` or
    ``trainer.add_callback(ReportCallback())``) inside the training function of a
    ``TorchTrainer``; every rank runs the Trainer and the callback.

    * Metrics: each ``Trainer.log`` (training loss, learning rate, evaluation
      metrics...) plus ``step`` (the global step) and ``epoch``; the logs of one
      optimizer step are merged into one ``train.report`` made once the step is over.
    * Checkpoints: every checkpoint the Trainer saves (``save_strategy`` /
      ``save_steps``) is reported, with the latest value of every metric logged so
      far (as Ray's ``RayTrainReportCallback``), as the run's checkpoint
      ``checkpoint-<global_step>`` holding the Trainer's folder as ``checkpoint/``
      (:attr:`CHECKPOINT_NAME`). Resume with
      ``trainer.train(resume_from_checkpoint=os.path.join(d, ReportCallback.CHECKPOINT_NAME))``
      where ``d`` is ``train.get_checkpoint().as_directory()``.

    Evaluate and save at compatible intervals (e.g. ``eval_strategy == save_strategy``)
    so that a checkpoint's metrics include the evaluation that scores it. A stop (a
    pruned Tune trial, a stopped run) raises out of the next report, which ends
    ``trainer.train()``.

    Example:
        >>> trainer = transformers.Trainer(model, args, train_dataset=ds,  # doctest: +SKIP
        ...     callbacks=[ReportCallback()])
        >>> trainer = prepare_trainer(trainer)  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[str, Any] = {}
        self._training = False

    def _report(self, metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        from lumos import train

        train.report(metrics, checkpoint=checkpoint, **kwargs)

    def _flush(self) -> None:
        if self._pending:
            metrics, self._pending = self._pending, {}
            self._report(metrics)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Check the Trainer's process group against lumos's; start collecting logs."""
        check_process_group(args)
        self._pending = {}
        self._training = True

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report the previous step's logs."""
        self._flush()

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report the last step's logs before the epoch's own log / evaluate / save."""
        self._flush()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report the Trainer's summary (``train_loss``, ``train_runtime``...) with the
        latest value of every metric, so that the run's final metrics hold them all."""
        if self._pending:
            self._pending = {**_latest(state), **self._pending}
        self._flush()
        self._training = False

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Collect ``logs`` for this step's report (reported at once outside ``train()``)."""
        self._pending.update(logs or {})
        self._pending["step"] = state.global_step
        if not self._training:  # e.g. trainer.evaluate() after train()
            self._flush()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report the checkpoint the Trainer just saved, with the latest metrics."""
        from lumos import train
        from lumos.storage import Checkpoint

        name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        folder = os.path.join(args.output_dir or "", name)
        if not os.path.isdir(folder):
            raise TrainConfigError(
                f"ReportCallback.on_save: the Trainer's checkpoint folder {folder!r} does not "
                "exist; the callback reports checkpoints of TrainingArguments.output_dir "
                "(a Trainer searching hyperparameters by itself is not supported)"
            )
        metrics = {**_latest(state), **self._pending}
        metrics["step"] = state.global_step
        self._pending = {}
        rank = train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory(prefix="lumos-hf-") as tmp:
            files = _owned_files(folder, rank)
            for rel in files:
                _link_or_copy(os.path.join(folder, rel), os.path.join(tmp, CHECKPOINT_NAME, rel))
            checkpoint = Checkpoint.from_directory(tmp) if files else None
            # SYNC upload (the default): the files are in the run when this returns
            self._report(metrics, checkpoint, checkpoint_dir_name=name)


#: Ray's name for :class:`ReportCallback`.
RayTrainReportCallback = ReportCallback


def check_process_group(args: TrainingArguments) -> None:
    """Raise when the Trainer's ranks are not lumos's (inside a training function only)."""
    from lumos.train._internal.session import _current

    session = _current.get()
    if session is None:
        return
    ctx = session.context
    world, rank = ctx.get_world_size(), ctx.get_world_rank()
    if (args.world_size, args.process_index) != (world, rank):
        raise TrainConfigError(
            f"the Hugging Face Trainer runs as process {args.process_index} of "
            f"{args.world_size}, but this lumos worker is rank {rank} of {world}: create "
            "the TrainingArguments inside the training function (after lumos set RANK, "
            "WORLD_SIZE, LOCAL_RANK and MASTER_ADDR), with use_cpu=True when the workers "
            "have no GPU"
        )


def check_fsdp_applies(trainer: Trainer) -> None:
    """Raise when the Trainer's arguments ask for FSDP that accelerate will not apply.

    accelerate (1.x) turns on FSDP only for GPU and other accelerator workers: on CPU
    workers it drops the FSDP plugin and the Trainer trains unsharded with DDP.
    """
    asked = trainer.args.fsdp
    if not asked or getattr(trainer.accelerator.state, "fsdp_plugin", None) is not None:
        return
    raise TrainConfigError(
        f"TrainingArguments(fsdp={asked!r}): accelerate applies a Trainer's FSDP only on "
        "GPU (or other accelerator) workers, and on these CPU workers the Trainer would "
        "train unsharded with DDP. Allowed here: fsdp left off. To shard on CPU, use "
        "lumos.train.torch.prepare_model(model, parallel_strategy='fsdp') in a training "
        "loop of your own"
    )


class _RayDataBatches(IterableDataset[Any]):
    """A Ray Data iterable (``iter_torch_batches()``) as a torch ``IterableDataset``."""

    def __init__(self, batches: Any) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def _is_ray_data_iterable(obj: Any) -> bool:
    if "ray.data" not in sys.modules:  # nothing can be one; don't import Ray Data
        return False
    from ray.data.iterator import _IterableFromIterator

    return isinstance(obj, _IterableFromIterator)


def _first(batch: list[Any]) -> Any:
    return batch[0]


def _batch_loader(batches: Any) -> DataLoader[Any]:
    # each item already is a batch: the loader hands it on as is
    return DataLoader(_RayDataBatches(batches), batch_size=1, collate_fn=_first)


def _check_trainer(trainer: Any) -> None:
    if not isinstance(trainer, transformers.Trainer):
        raise TrainTypeError(
            f"prepare_trainer(trainer={trainer!r}): expected a transformers.Trainer, got "
            f"{type(trainer).__name__}"
        )
    check_process_group(trainer.args)
    check_fsdp_applies(trainer)


def prepare_trainer(trainer: Trainer) -> Trainer:
    """Prepare a ``transformers.Trainer`` for lumos; call it in the training function.

    * Ray Data input: a ``train_dataset`` / ``eval_dataset`` that is a shard's
      ``train.get_dataset_shard(name).iter_torch_batches(batch_size=...)`` is read
      batch by batch as is (each worker already has its own shard).
    * Checks that the Trainer's ``TrainingArguments`` see lumos's process group
      (``args.world_size`` / ``args.process_index`` are this run's world size and
      rank): create them inside the training function, with ``use_cpu=True`` on CPU
      workers. accelerate then uses the group lumos started (gloo on CPU, NCCL on
      GPU) instead of starting its own.
    * Refuses ``TrainingArguments(fsdp=...)`` that accelerate would not apply (on CPU
      workers it trains unsharded with DDP instead).

    Args:
        trainer: a ``transformers.Trainer`` (or a subclass).

    Returns:
        The same Trainer, its class now a subclass of its own class.

    Raises:
        TrainTypeError: ``trainer`` is not a ``transformers.Trainer``.
        TrainConfigError: the Trainer's ranks are not this run's, or FSDP on CPU.

    Example:
        >>> trainer = prepare_trainer(transformers.Trainer(model, args,  # doctest: +SKIP
        ...     train_dataset=ds, callbacks=[ReportCallback()]))
    """
    _check_trainer(trainer)
    base: type[Any] = type(trainer)
    if getattr(base, "_lumos_prepared", False):
        return trainer

    class LumosTransformersTrainer(base):  # type: ignore[misc]
        """The user's Trainer class, reading Ray Data shards batch by batch."""

        _lumos_prepared = True

        def get_train_dataloader(self) -> DataLoader[Any]:
            if _is_ray_data_iterable(self.train_dataset):
                return _batch_loader(self.train_dataset)
            loader: DataLoader[Any] = super().get_train_dataloader()
            return loader

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader[Any]:
            data = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(data, str) and isinstance(self.eval_dataset, dict):
                data = self.eval_dataset[data]
            if _is_ray_data_iterable(data):
                return _batch_loader(data)
            loader: DataLoader[Any] = super().get_eval_dataloader(eval_dataset)
            return loader

    LumosTransformersTrainer.__name__ = f"Lumos{base.__name__}"
    LumosTransformersTrainer.__qualname__ = LumosTransformersTrainer.__name__
    trainer.__class__ = LumosTransformersTrainer
    return trainer
