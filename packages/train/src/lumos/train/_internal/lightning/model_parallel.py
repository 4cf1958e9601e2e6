"""Lightning's sharded training (FSDP2) on the lumos process group: ``LumosModelParallelStrategy``.

Lightning's ``ModelParallelStrategy`` applies FSDP2 (``fully_shard`` in the module's
``configure_model``, over ``self.device_mesh["data_parallel"]``) and saves a sharded
checkpoint with DCP: ``checkpoint.ckpt`` becomes a directory holding one
``__<rank>_0.distcp`` per rank, plus DCP's ``.metadata`` and Lightning's ``meta.pt``
from rank 0. It trains on CPU workers (gloo) as on GPUs; Lightning's ``FSDPStrategy``
(FSDP1) does not: ``lightning/pytorch/trainer/connectors/accelerator_connector.py``
raises "requires a GPU accelerator" for any other accelerator.

Three things differ from Lightning's own strategy on a lumos worker:

* the group is lumos's (``LumosLightningEnvironment``, ``LocalGroup`` in local mode),
  and each lumos process has one device, so the mesh's ``"auto"`` sizes come from the
  run's world size (:func:`mesh_sizes`), not from Lightning's nodes x devices;
* the device is ``lumos.train.torch.get_device()``, and Lightning launches no process
  (``OnLumosWorker``);
* a checkpoint path is each rank's own: Lightning broadcasts rank 0's path so that every
  rank writes into one shared folder, which exists only on rank 0's node. lumos instead
  uploads each rank's folder into the same checkpoint of the run, so every rank writes
  its shards into the folder it was given (``ReportCallback``'s), and loads from its own.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lightning.pytorch.strategies import ModelParallelStrategy

from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.lightning.strategy import (
    LocalGroup,
    OnLumosWorker,
    refuse_group_settings,
)

_GROUP_SETTINGS = ("process_group_backend", "timeout")
"""ModelParallelStrategy arguments that shape the process group, which lumos forms."""

T = TypeVar("T")


def _check_size(field: str, value: Any) -> None:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    raise TrainConfigError(
        f"LumosModelParallelStrategy({field}={value!r}): pass an int >= 1 or 'auto'"
    )


def mesh_sizes(data_parallel: int | str, tensor_parallel: int | str, world: int) -> tuple[int, int]:
    """The device mesh's ``(data_parallel_size, tensor_parallel_size)`` for ``world`` ranks.

    ``tensor_parallel_size="auto"`` is 1 (every rank one FSDP2 shard);
    ``data_parallel_size="auto"`` is ``world // tensor_parallel_size``.

    Raises:
        TrainConfigError: the sizes do not multiply to the world size, or ``"auto"``
            does not divide it; the message names both fields and the world size.
    """
    tp = 1 if tensor_parallel == "auto" else int(tensor_parallel)
    dp = world // tp if data_parallel == "auto" else int(data_parallel)
    if dp * tp != world:
        raise TrainConfigError(
            f"LumosModelParallelStrategy(data_parallel_size={data_parallel!r}, "
            f"tensor_parallel_size={tensor_parallel!r}): the two multiplied must equal the "
            f"run's world size, ScalingConfig(num_workers) = {world} (one rank per worker); "
            "leave both 'auto' for FSDP2 over every rank"
        )
    return dp, tp


class LumosModelParallelStrategy(OnLumosWorker, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 + DCP checkpoints) on lumos's process group.

    Takes ``ModelParallelStrategy``'s arguments except those that shape the process
    group (``process_group_backend``, ``timeout``: set them in
    ``TorchConfig(backend=..., timeout_s=...)``). ``data_parallel_size`` and
    ``tensor_parallel_size`` default to ``"auto"``: FSDP2 over all of the run's ranks.
    Shard the model in the module's ``configure_model`` (``fully_shard(layer,
    mesh=self.device_mesh["data_parallel"])``); with :class:`ReportCallback` each
    checkpoint holds every rank's DCP shards, and ``get_checkpoint_path()`` resumes from
    it on any world size (DCP reshards on load).

    Raises:
        TrainConfigError: a process-group argument, or a mesh size that is neither an
            int >= 1 nor ``"auto"`` (a ``ValueError``); at set-up, sizes whose product
            is not the world size.

    Example:
        >>> trainer = pl.Trainer(strategy=LumosModelParallelStrategy(),  # doctest: +SKIP
        ...     plugins=[LumosLightningEnvironment()], callbacks=[ReportCallback()])
    """

    def __init__(
        self,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        **kwargs: Any,
    ) -> None:
        refuse_group_settings("LumosModelParallelStrategy", kwargs, _GROUP_SETTINGS)
        _check_size("data_parallel_size", data_parallel_size)
        _check_size("tensor_parallel_size", tensor_parallel_size)
        super().__init__(
            data_parallel_size=data_parallel_size,  # type: ignore[arg-type]
            tensor_parallel_size=tensor_parallel_size,  # type: ignore[arg-type]
            save_distributed_checkpoint=save_distributed_checkpoint,
            **kwargs,
        )
        self._sizes = (data_parallel_size, tensor_parallel_size)
        self._local_group = LocalGroup()
        self._own_paths = False

    def setup_environment(self) -> None:
        """Resolve the mesh sizes from lumos's world size, join its group, build the mesh."""
        dp, tp = mesh_sizes(*self._sizes, self.world_size)
        self._data_parallel_size, self._tensor_parallel_size = dp, tp
        self._local_group.before_setup()
        super().setup_environment()

    def teardown(self) -> None:
        """Lightning's teardown; then destroy the group only if Lightning formed it."""
        super().teardown()
        self._local_group.after_teardown()

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Lightning's broadcast, except for a checkpoint path (each rank keeps its own)."""
        if self._own_paths:
            return obj
        return super().broadcast(obj, src)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Write this rank's shards (rank 0 also the metadata) under its own ``filepath``."""
        self._own_paths = True
        try:
            super().save_checkpoint(checkpoint, filepath, storage_options)
        finally:
            self._own_paths = False

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> Any:
        """Load every rank's shards from its own copy of the checkpoint (resharded by DCP)."""
        self._own_paths = True
        try:
            return super().load_checkpoint(checkpoint_path, weights_only)
        finally:
            self._own_paths = False
