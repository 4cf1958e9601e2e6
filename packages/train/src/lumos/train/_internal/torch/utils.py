"""prepare_model, prepare_data_loader, get_device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.session import current_session


def _world() -> tuple[int, int]:
    try:
        ctx = current_session("get_device").context
    except RuntimeError:
        return 0, 1
    return ctx.get_world_rank(), ctx.get_world_size()


def get_device() -> torch.device:
    """The device this worker should use: its GPU when it has one, else the CPU.

    Example:
        >>> model.to(get_device())  # doctest: +SKIP
    """
    if torch.cuda.is_available():
        try:
            ctx = current_session("get_device").context
        except RuntimeError:
            return torch.device("cuda", torch.cuda.current_device())
        if ctx.get_worker_info().gpu_ids:
            return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it for data-parallel training.

    With more than one worker the model is wrapped in
    ``torch.nn.parallel.DistributedDataParallel`` (gradients are averaged
    across workers on ``backward()``); with one worker it is returned as is.

    Args:
        model: the model.
        move_to_device: move it to ``get_device()`` first.
        parallel_strategy: ``"ddp"`` (default) or ``None`` (no wrapping).
        parallel_strategy_kwargs: extra keyword arguments for DDP.

    Returns:
        The prepared model (access the original as ``model.module`` under DDP).

    Example:
        >>> model = prepare_model(torch.nn.Linear(4, 1))  # doctest: +SKIP
    """
    if parallel_strategy not in ("ddp", None):
        raise TrainConfigError(
            f"parallel_strategy={parallel_strategy!r} is not supported; use 'ddp' or None"
        )
    device = get_device()
    if move_to_device:
        model = model.to(device)
    _, world = _world()
    if parallel_strategy is None or world <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    kwargs = dict(parallel_strategy_kwargs or {})
    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
    return DistributedDataParallel(model, **kwargs)


class _PreparedLoader:
    """Iterates a DataLoader, moving batches to the device and advancing the sampler's epoch."""

    def __init__(self, loader: DataLoader[Any], device: torch.device | None) -> None:
        self._loader = loader
        self._device = device
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __iter__(self) -> Iterator[Any]:
        sampler = self._loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(self._epoch)
        self._epoch += 1
        for batch in self._loader:
            yield batch if self._device is None else _move(batch, self._device)


def _move(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_move(b, device) for b in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_move(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _move(v, device) for k, v in batch.items()}
    return batch


def prepare_data_loader(
    data_loader: DataLoader[Any],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
) -> Any:
    """Shard ``data_loader`` across workers and move its batches to the device.

    With more than one worker the loader is rebuilt with a
    ``DistributedSampler`` (each worker reads a different part of the data;
    shuffling is kept when the original loader shuffled). Every ``for`` loop
    over the returned loader is one epoch: the sampler's epoch advances by
    itself, so shuffles differ between epochs (no ``set_epoch`` needed).

    Args:
        data_loader: a ``torch.utils.data.DataLoader`` over a map-style dataset.
        add_dist_sampler: shard with a ``DistributedSampler``.
        move_to_device: move tensors in each batch to ``get_device()``.

    Returns:
        An iterable with the loader's interface (``len``, attributes).

    Example:
        >>> loader = prepare_data_loader(DataLoader(ds, batch_size=32, shuffle=True))  # doctest: +SKIP
        >>> for epoch in range(3):
        ...     for x, y in loader: ...
    """
    rank, world = _world()
    loader = data_loader
    if (
        add_dist_sampler
        and world > 1
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
    ):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler: DistributedSampler[Any] = DistributedSampler(
            loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle
        )
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
            persistent_workers=loader.persistent_workers if loader.num_workers > 0 else False,
        )
    return _PreparedLoader(loader, get_device() if move_to_device else None)
