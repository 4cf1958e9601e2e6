"""Lightning on the lumos process group: the cluster environment and DDP strategy.

lumos forms the ``torch.distributed`` group (gloo or NCCL, ``TorchConfig``) before the
training function runs (``torch/backend.py``) and destroys it when the function ends.
Lightning must join that group, not start one: :class:`LumosLightningEnvironment`
reports lumos's ranks and world size (from ``train.get_context()``) and says that the
processes are created outside Lightning, and Lightning's set-up skips
``init_process_group`` when a group exists. :class:`LumosDDPStrategy` places the
model on this worker's device (``lumos.train.torch.get_device()``) and gives
Lightning's ``DistributedSampler`` lumos's ranks. In local mode (``num_workers=0``,
one rank, no group) Lightning forms a one-process group on a free local port, which
:class:`LocalGroup` destroys (and its ``MASTER_*`` variables undoes) when the fit ends.
The sharded strategy (``model_parallel.py``) shares both helpers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lumos.train._internal.api import get_context
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.torch.backend import destroy_process_group_quietly
from lumos.train._internal.torch.utils import get_device

_GROUP_SETTINGS = ("process_group_backend", "timeout", "start_method")
"""DDPStrategy arguments that shape the process group, which lumos forms."""


def refuse_group_settings(strategy: str, kwargs: dict[str, Any], settings: tuple[str, ...]) -> None:
    """Raise ``TrainConfigError`` when ``kwargs`` sets one of ``settings`` (lumos forms the group).

    Raises:
        TrainConfigError: the first such setting, its value and where to set it instead.
    """
    given = [name for name in settings if name in kwargs]
    if given:
        raise TrainConfigError(
            f"{strategy}({given[0]}={kwargs[given[0]]!r}): lumos forms the process "
            f"group before the training function runs, so {', '.join(settings)} cannot "
            "be set here; use TorchTrainer(torch_config=TorchConfig(backend=..., timeout_s=...))"
        )


class LocalGroup:
    """The one-process group Lightning forms in local mode, where lumos formed none.

    :meth:`before_setup` notes whether a group exists (lumos's: left alone) and saves
    ``MASTER_ADDR`` / ``MASTER_PORT``, which Lightning sets when it forms its own;
    :meth:`after_teardown` destroys the group Lightning formed and restores both.
    """

    def __init__(self) -> None:
        self._saved: dict[str, str | None] | None = None  # set when Lightning forms the group

    def before_setup(self) -> None:
        """Call before Lightning's distributed set-up."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            self._saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}

    def after_teardown(self) -> None:
        """Call after Lightning's teardown: undo what Lightning's own group changed."""
        saved, self._saved = self._saved, None
        if saved is None:
            return  # lumos's group: lumos destroys it when the training function ends
        destroy_process_group_quietly()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


class OnLumosWorker:
    """What both of lumos's Lightning strategies share (a mixin, listed before Lightning's class).

    lumos starts one process per rank, so Lightning launches none: without
    ``plugins=[LumosLightningEnvironment()]`` Lightning would configure its subprocess
    launcher for its default environment before ``prepare_trainer`` replaces it, and
    that launcher sets ``MASTER_*``, ``WORLD_SIZE`` and ``LOCAL_RANK`` in the worker.
    """

    _launcher: Any

    def _configure_launcher(self) -> None:
        self._launcher = None  # lumos created this process; Lightning launches nothing

    @property
    def root_device(self) -> torch.device:
        """This worker's device: its GPU when it has one, else the CPU."""
        return get_device()


class LumosDDPStrategy(OnLumosWorker, DDPStrategy):
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
        refuse_group_settings("LumosDDPStrategy", kwargs, _GROUP_SETTINGS)
        super().__init__(**kwargs)
        self._local_group = LocalGroup()

    def setup_distributed(self) -> None:
        """Join lumos's process group; in local mode (none), let Lightning form one."""
        self._local_group.before_setup()
        super().setup_distributed()

    def teardown(self) -> None:
        """Lightning's teardown; then destroy the group only if Lightning formed it."""
        super().teardown()
        self._local_group.after_teardown()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """lumos's ranks for Lightning's ``DistributedSampler``."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}


RayDDPStrategy = LumosDDPStrategy
"""Ray Train's name of :class:`LumosDDPStrategy`."""

RayLightningEnvironment = LumosLightningEnvironment
"""Ray Train's name of :class:`LumosLightningEnvironment`."""
