"""TorchTrainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.runtime import GroupFactory
from lumos.train._internal.backend import Backend
from lumos.train._internal.config import RunConfig, ScalingConfig
from lumos.train._internal.controller.spec import ControllerSettings
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.torch.backend import TorchBackend
from lumos.train._internal.torch.config import TorchConfig
from lumos.train._internal.torch.torchft_backend import TorchftBackend
from lumos.train._internal.torch.torchft_config import TorchftConfig
from lumos.train._internal.trainer import DataParallelTrainer

if TYPE_CHECKING:
    from lumos.storage import Checkpoint
    from lumos.train._internal.data_config import DataConfig
    from lumos.train._internal.validation import ValidationConfig


class TorchTrainer(DataParallelTrainer):
    """Data-parallel PyTorch training: ``DataParallelTrainer`` plus a process group.

    Every worker joins one ``torch.distributed`` process group (gloo on CPU,
    nccl with ``use_gpu=True``) before ``train_loop_per_worker`` starts, with
    ``MASTER_ADDR``/``MASTER_PORT`` taken from rank 0 and ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK`` set. Use ``prepare_model`` and
    ``prepare_data_loader`` inside the function.

    Args:
        train_loop_per_worker: ``fn(config)`` or ``fn()``, run on every worker.
        train_loop_config: the ``config`` dict passed to it.
        torch_config: backend and timeout of the process group.
        scaling_config: how many workers, GPUs, resources.
        run_config: name, storage, failure and checkpoint settings, callbacks.
        resume_from_checkpoint: a checkpoint to start from (fine-tuning):
            ``train.get_checkpoint()`` returns it until the run commits its own.
        datasets: Ray Datasets by name (``lumos-train[data]``), read in the function
            with ``train.get_dataset_shard(name)``.
        dataset_config: ``train.DataConfig``: which datasets are split across workers.

    Example:
        >>> trainer = TorchTrainer(train_fn, train_loop_config={"lr": 1e-3},
        ...     scaling_config=train.ScalingConfig(num_workers=2),
        ...     run_config=train.RunConfig(name="mnist", storage_path="/tmp/runs"))
        >>> result = trainer.fit()  # doctest: +SKIP
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        validation_config: ValidationConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        _group_factory: GroupFactory | None = None,
        _controller_settings: ControllerSettings | None = None,
    ) -> None:
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            resume_from_checkpoint=resume_from_checkpoint,
            validation_config=validation_config,
            datasets=datasets,
            dataset_config=dataset_config,
            _group_factory=_group_factory,
            _controller_settings=_controller_settings,
        )
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TrainConfigError(f"torch_config={torch_config!r} is not a TorchConfig")
        self.torch_config = torch_config or TorchConfig()
        if isinstance(self.torch_config, TorchftConfig) and self.scaling_config.num_workers == 0:
            raise TrainConfigError(
                "torch_config=TorchftConfig(...) needs Ray workers, but "
                "ScalingConfig(num_workers=0) runs in this process; set num_workers >= 1"
            )
        if self.torch_config.backend == "nccl" and not self.scaling_config.use_gpu:
            raise TrainConfigError(
                "TorchConfig(backend='nccl') needs GPUs but ScalingConfig(use_gpu=False); "
                "use backend='gloo' on CPU or set use_gpu=True"
            )

    def _backend(self) -> Backend:
        if isinstance(self.torch_config, TorchftConfig):
            return TorchftBackend(self.torch_config)
        return TorchBackend(self.torch_config, self.scaling_config.use_gpu)
