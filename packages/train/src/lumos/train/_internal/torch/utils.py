"""prepare_model, prepare_data_loader, get_device."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from lumos.train._internal.errors import TrainConfigError, TrainTypeError
from lumos.train._internal.reporting import CURRENT
from lumos.train._internal.session import current_session
from lumos.train._internal.torch import samplers
from lumos.train._internal.torch.samplers import ShuffleSampler


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
    across workers on ``backward()``), or sharded with FSDP2 (``fully_shard``: each
    rank holds a shard of every parameter); with one worker it is returned as is.

    Args:
        model: the model.
        move_to_device: move it to ``get_device()`` first.
        parallel_strategy: ``"ddp"`` (default), ``"fsdp"`` (FSDP2, sharded in place;
            save it with ``save_sharded_state``) or ``None`` (no wrapping).
        parallel_strategy_kwargs: extra keyword arguments for DDP; for FSDP
            ``mesh``, ``reshard_after_forward``, ``mp_policy`` (a
            ``MixedPrecisionPolicy``), ``offload_policy`` (a ``CPUOffloadPolicy``) and
            ``shard_modules`` (submodule classes sharded on their own, e.g. the
            transformer blocks).

    Returns:
        The prepared model (the original is ``model.module`` under DDP, itself under FSDP).

    Raises:
        TrainConfigError: an unknown ``parallel_strategy``, or a
            ``parallel_strategy_kwargs`` key that does not apply to FSDP.

    Example:
        >>> model = prepare_model(torch.nn.Linear(4, 1))  # doctest: +SKIP
        >>> model = prepare_model(net, parallel_strategy="fsdp",  # doctest: +SKIP
        ...     parallel_strategy_kwargs={"shard_modules": (Block,)})
    """
    if parallel_strategy not in ("ddp", "fsdp", None):
        raise TrainConfigError(f"prepare_model(parallel_strategy={parallel_strategy!r}) is "
                               "not supported; use 'ddp' (default), 'fsdp' or None")  # fmt: skip
    kwargs = dict(parallel_strategy_kwargs or {})
    if parallel_strategy == "fsdp":
        from lumos.train._internal.torch.fsdp import check_fsdp_kwargs

        check_fsdp_kwargs(kwargs)  # a typo fails on every world size, one worker included
    device = get_device()
    if move_to_device:
        model = model.to(device)
    _, world = _world()
    if parallel_strategy is None or world <= 1:
        return model
    if parallel_strategy == "fsdp":
        from lumos.train._internal.torch.fsdp import shard_model

        return shard_model(model, kwargs, device, world)
    from torch.nn.parallel import DistributedDataParallel

    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
    return DistributedDataParallel(model, **kwargs)


class _PreparedLoader:
    """A ``StatefulDataLoader`` that moves batches to the device, counts epochs and resumes.

    Every ``for`` loop over it is one epoch (the ``DistributedSampler``'s epoch advances
    by itself). Its position (epoch, and the loader's ``state_dict()`` within it) is
    taken at every ``train.report()`` (see ``data_positions.py``); on a resumed attempt
    the position saved with the checkpoint is applied at the first ``__iter__``.
    """

    def __init__(self, loader: StatefulDataLoader, device: torch.device | None) -> None:
        self._loader = loader
        self._device = device
        self._epoch = -1  # the current (or last) epoch; -1 before the first loop
        self._in_epoch = False
        self._pending: dict[str, Any] | None = None
        session = CURRENT.get()
        if session is not None:
            self._pending = session.positions.register(self)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) loop over the loader; -1 before the first."""
        return self._epoch

    def position_state(self) -> dict[str, Any]:
        """The position now: the epoch, whether it finished, the loader's ``state_dict``."""
        if self._epoch < 0:
            return {"epoch": -1, "finished": True, "loader": None}
        return {
            "epoch": self._epoch,
            "finished": not self._in_epoch,
            "loader": self._loader.state_dict(),
        }

    def load_position(self, position: dict[str, Any]) -> None:
        """Resume from ``position`` (from :meth:`position_state`) at the next ``__iter__``."""
        self._pending = position

    def _start_epoch(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending["epoch"] >= 0:
            self._epoch = pending["epoch"]
            state = pending["loader"]
            if not pending["finished"]:
                self._set_epoch(self._epoch)
                if state is not None:  # None: saved with another world size (epoch over)
                    self._loader.load_state_dict(state)
                return
            if state is not None:  # the sampler's random state after that epoch
                self._loader.load_state_dict(state)
        self._epoch += 1
        self._set_epoch(self._epoch)

    def _set_epoch(self, epoch: int) -> None:
        sampler = self._loader.sampler
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self._start_epoch()
        self._in_epoch = True
        device = self._device
        for batch in self._loader:
            yield batch if device is None else _move(batch, device)
        self._in_epoch = False


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
    """Shard ``data_loader`` across workers, move its batches to the device, resume it.

    With more than one worker the loader is rebuilt with a
    ``DistributedSampler`` (each worker reads a different part of the data;
    shuffling is kept when the original loader shuffled). Every ``for`` loop
    over the returned loader is one epoch: the sampler's epoch advances by
    itself, so shuffles differ between epochs (no ``set_epoch`` needed).

    The returned loader is a torchdata ``StatefulDataLoader``: its position is saved
    with every checkpoint a ``train.report()`` commits, and on a resumed attempt
    (restart after a failure, job-level restore) the loader continues from the
    position of the checkpoint it resumes from, by itself: with the same seed a rank
    sees the same batches as without the failure (those consumed after that
    checkpoint are seen again). Loaders are told apart by the order the training
    function prepares them in. See "Data input" in the package README.

    Args:
        data_loader: a ``torch.utils.data.DataLoader`` (or torchdata
            ``StatefulDataLoader``), map-style or iterable.
        add_dist_sampler: shard with a ``DistributedSampler``.
        move_to_device: move tensors in each batch to ``get_device()``.

    Returns:
        An iterable with the loader's interface (``len``, attributes).

    Raises:
        TrainTypeError: ``data_loader`` is not a ``torch.utils.data.DataLoader``.

    Example:
        >>> loader = prepare_data_loader(DataLoader(ds, batch_size=32, shuffle=True))  # doctest: +SKIP
        >>> for epoch in range(3):
        ...     for x, y in loader: ...
    """
    if not isinstance(data_loader, DataLoader):
        raise TrainTypeError(
            f"prepare_data_loader(data_loader={data_loader!r}): expected a "
            "torch.utils.data.DataLoader"
        )
    rank, world = _world()
    loader = data_loader
    sampler: Any = None
    if (
        add_dist_sampler
        and world > 1
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
        and not _custom_batch_sampler(loader)
    ):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = StatefulDistributedSampler(
            loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle
        )
    if sampler is not None or not isinstance(loader, StatefulDataLoader):
        loader = _stateful(loader, sampler)
    return _PreparedLoader(loader, get_device() if move_to_device else None)


def _custom_batch_sampler(loader: DataLoader[Any]) -> bool:
    return loader.batch_size is None and loader.batch_sampler is not None


def _stateful(loader: DataLoader[Any], sampler: Any) -> StatefulDataLoader:
    with warnings.catch_warnings():
        # torchdata 0.11 calls torch.set_vital, which torch >= 2.10 deprecates
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        return _build_stateful(loader, sampler)


def _build_stateful(loader: DataLoader[Any], sampler: Any) -> StatefulDataLoader:
    """``loader`` rebuilt as a ``StatefulDataLoader`` (with ``sampler`` when given).

    torch's ``RandomSampler`` and ``SequentialSampler`` become ``samplers.py``'s, which
    resume by jumping to their position (the random state is part of it); any other
    sampler is kept, and resumes by skipping the indices it already yielded in the
    epoch (torchdata's fallback, O(position)).
    """
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "pin_memory_device": loader.pin_memory_device,
        "in_order": getattr(loader, "in_order", True),
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["persistent_workers"] = loader.persistent_workers
    if _custom_batch_sampler(loader):
        return StatefulDataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **kwargs)
    batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    if isinstance(loader.dataset, IterableDataset):
        return StatefulDataLoader(loader.dataset, **batching, **kwargs)
    if sampler is None:
        sampler = loader.sampler
        if (
            type(sampler) is RandomSampler
            and not sampler.replacement
            and sampler._num_samples is None
        ):
            sampler = ShuffleSampler(sampler.data_source, generator=sampler.generator)
        elif type(sampler) is SequentialSampler:
            sampler = samplers.SequentialSampler(sampler.data_source)
    return StatefulDataLoader(loader.dataset, sampler=sampler, **batching, **kwargs)
