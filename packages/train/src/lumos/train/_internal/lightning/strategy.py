"""Lightning's DDP on the lumos process group: strategy, cluster environment, ``prepare_trainer``.

lumos forms the ``torch.distributed`` group (gloo or NCCL, ``TorchConfig``) before the
training function runs (``torch/backend.py``) and destroys it when the function ends.
Lightning must join that group, not start one: :class:`LumosLightningEnvironment`
reports lumos's ranks and world size (from ``train.get_context()``) and says that the
processes are created outside Lightning, and Lightning's DDP set-up skips
``init_process_group`` when a group exists. :class:`LumosDDPStrategy` places the
model on this worker's device (``lumos.train.torch.get_device()``) and gives
Lightning's ``DistributedSampler`` lumos's ranks. In local mode (``num_workers=0``,
one rank, no group) Lightning forms a one-process group on a free local port, which
the strategy destroys (and its ``MASTER_*`` variables undoes) when the fit ends.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lumos.train._internal.api import get_context
from lumos.train._internal.errors import TrainConfigError, TrainTypeError
from lumos.train._internal.torch.backend import destroy_process_group_quietly
from lumos.train._internal.torch.utils import get_device

_GROUP_SETTINGS = ("process_group_backend", "timeout", "start_method")
"""DDPStrategy arguments that shape the process group, which lumos forms."""


class LumosLightningEnvironment(LightningEnvironment):
    """Lightning's cluster environment for a lumos worker: lumos's ranks and world size.

    Ray Train's ``RayLightningEnvironment`` (also exported under that name). The ranks
    come from ``train.get_context()``; Lightning's setters are ignored, and the
    processes are always created by lumos, never launched by Lightning.

    Example:
        >>> trainer = pl.Trainer(strategy=LumosDDPStrategy(),  # doctest: +SKIP
        ...     plugins=[LumosLightningEnvironment()])
    """

    @property
    def creates_processes_externally(self) -> bool:
        """Always true: lumos starts one process per rank (Lightning launches none)."""
        return True

    def world_size(self) -> int:
        """The run's world size (``train.get_context().get_world_size()``)."""
        return get_context().get_world_size()

    def global_rank(self) -> int:
        """This worker's rank in the run."""
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        """This worker's rank on its node."""
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        """The rank of this worker's node."""
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is lumos's."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is lumos's."""

    def teardown(self) -> None:
        """Nothing to undo: lumos owns the environment variables and the process group."""


class LumosDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` on the lumos process group.

    Ray Train's ``RayDDPStrategy`` (also exported under that name). Takes the keyword
    arguments of ``lightning.pytorch.strategies.DDPStrategy`` except those that shape
    the process group (``process_group_backend``, ``timeout``, ``start_method``):
    lumos forms the group, so set them in ``TorchConfig(backend=..., timeout_s=...)``.

    Raises:
        TrainConfigError: a process-group argument was given (a ``ValueError``).

    Example:
        >>> trainer = pl.Trainer(strategy=LumosDDPStrategy(find_unused_parameters=True),
        ...     plugins=[LumosLightningEnvironment()], callbacks=[ReportCallback()])  # doctest: +SKIP
    """

    def __init__(self, **kwargs: Any) -> None:
        given = [name for name in _GROUP_SETTINGS if name in kwargs]
        if given:
            raise TrainConfigError(
                f"LumosDDPStrategy({given[0]}={kwargs[given[0]]!r}): lumos forms the process "
                "group before the training function runs, so "
                f"{', '.join(_GROUP_SETTINGS)} cannot be set here; use "
                "TorchTrainer(torch_config=TorchConfig(backend=..., timeout_s=...))"
            )
        super().__init__(**kwargs)
        self._own_group: dict[str, str | None] | None = None  # set when Lightning formed it

    def setup_distributed(self) -> None:
        """Join lumos's process group; in local mode (none), let Lightning form one."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            # local mode without torchrun: Lightning forms a one-process group and sets
            # MASTER_ADDR / MASTER_PORT; teardown() undoes both
            self._own_group = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
        super().setup_distributed()

    def teardown(self) -> None:
        """Lightning's teardown; then destroy the group only if Lightning formed it."""
        super().teardown()
        saved, self._own_group = self._own_group, None
        if saved is None:
            return  # lumos's group: lumos destroys it when the training function ends
        destroy_process_group_quietly()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    @property
    def root_device(self) -> torch.device:
        """This worker's device: its GPU when it has one, else the CPU."""
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """lumos's ranks for Lightning's ``DistributedSampler``."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check (and complete) a Lightning ``Trainer`` for a lumos training function.

    The trainer must use :class:`LumosDDPStrategy` (or a subclass). Its cluster
    environment becomes a :class:`LumosLightningEnvironment` when it is another one
    (Lightning picks ``LightningEnvironment`` when none is given): lumos's process
    group is already formed, and only lumos knows its ranks. Call it inside the
    training function, before ``trainer.fit``.

    Args:
        trainer: The ``lightning.pytorch.Trainer`` to run.

    Returns:
        The same trainer.

    Raises:
        TrainTypeError: ``trainer`` is not a ``lightning.pytorch.Trainer`` (a ``TypeError``).
        TrainConfigError: its strategy is not a ``LumosDDPStrategy`` (a ``ValueError``).
        NotInTrainingFunctionError: called outside a training function.

    Example:
        >>> trainer = prepare_trainer(pl.Trainer(max_epochs=3,  # doctest: +SKIP
        ...     strategy=LumosDDPStrategy(), callbacks=[ReportCallback()]))
    """
    if not isinstance(trainer, pl.Trainer):
        raise TrainTypeError(
            f"prepare_trainer(trainer) needs a lightning.pytorch.Trainer, got "
            f"{type(trainer).__module__}.{type(trainer).__qualname__}"
        )
    strategy = trainer.strategy
    if not isinstance(strategy, LumosDDPStrategy):
        raise TrainConfigError(
            f"Trainer(strategy=...) is a {type(strategy).__name__}; lumos runs Lightning "
            "with lumos.train.lightning.LumosDDPStrategy (Ray's name: RayDDPStrategy) or a "
            "subclass: pl.Trainer(strategy=LumosDDPStrategy(), "
            "plugins=[LumosLightningEnvironment()], ...)"
        )
    get_context()  # NotInTrainingFunctionError outside a training function
    if not isinstance(strategy.cluster_environment, LumosLightningEnvironment):
        strategy.cluster_environment = LumosLightningEnvironment()
    return trainer


RayDDPStrategy = LumosDDPStrategy
"""Ray Train's name of :class:`LumosDDPStrategy`."""

RayLightningEnvironment = LumosLightningEnvironment
"""Ray Train's name of :class:`LumosLightningEnvironment`."""
