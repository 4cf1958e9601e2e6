"""How the ranks of a local-mode run share their messages: alone, or torchrun's processes.

A single process (``ScalingConfig(num_workers=0)``) exchanges nothing (:class:`Alone`).
Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` set) every process is one rank: :class:`TorchrunExchange` joins the
default process group from torchrun's environment (unless the script already did)
and creates a separate gloo group for lumos's messages, so that they never interleave
with the script's collectives.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from lumos.runtime import WorkerInfo

T = TypeVar("T")

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""The variables ``torchrun`` sets that local mode needs to join its process group."""


def has_torchrun_env() -> bool:
    """True when this process was started by ``torchrun`` (its rendezvous env is set)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


class Exchange(Protocol):
    """The ranks of one local run and the two collectives they use."""

    rank: int
    world_size: int

    def gather(self, item: Any) -> list[Any]:
        """Every rank's ``item``, in rank order, on every rank (a collective)."""
        ...

    def broadcast(self, item: Any) -> Any:
        """Rank 0's ``item`` on every rank (a collective)."""
        ...

    def close(self) -> None: ...


class Alone:
    """The exchange of a single-process run: nothing to exchange."""

    rank = 0
    world_size = 1

    def gather(self, item: Any) -> list[Any]:
        return [item]

    def broadcast(self, item: Any) -> Any:
        return item

    def close(self) -> None:
        pass


class TorchrunExchange:
    """The ranks torchrun started, exchanging small objects over their own gloo group.

    Args:
        backend: The default process group's backend (``"gloo"`` or ``"nccl"``).
        use_gpu: Give the rank its local GPU (``torch.cuda.set_device(local_rank)``).
    """

    def __init__(self, backend: str, use_gpu: bool) -> None:
        import torch
        import torch.distributed as dist

        self._owns_default = not dist.is_initialized()
        local_rank = int(os.environ["LOCAL_RANK"])
        if use_gpu and torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        if self._owns_default:
            dist.init_process_group(backend=backend)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group: Any = dist.new_group(backend="gloo")

    def gather(self, item: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, item, group=self._group)
        return out

    def broadcast(self, item: Any) -> Any:
        import torch.distributed as dist

        box = [item]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def close(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        with contextlib.suppress(Exception):
            dist.destroy_process_group(self._group)
        if self._owns_default:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def open_exchange(backend: str, use_gpu: bool) -> Exchange:
    """torchrun's ranks when its environment is set, else this process alone."""
    return TorchrunExchange(backend, use_gpu) if has_torchrun_env() else Alone()


def share(exchange: Exchange, mine: bool, fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0 (``mine``), its value (or error) on every rank."""
    value: Any = None
    error: BaseException | None = None
    if mine:
        try:
            value = fn()
        except Exception as exc:
            error = exc
    if exchange.world_size > 1:
        value, shared = exchange.broadcast((value, portable(error)))
        error = error if mine else shared
    if error is not None:
        raise error
    result: T = value
    return result


def portable(error: BaseException | None) -> BaseException | None:
    """``error`` as the other ranks can receive it (a text copy when it does not pickle)."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"rank 0: {type(error).__name__}: {error}")
    return error


def worker_info(exchange: Exchange, use_gpu: bool) -> WorkerInfo:
    """The runtime ``WorkerInfo`` of this process's rank (from torchrun's environment)."""
    rank, world = exchange.rank, exchange.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) if world > 1 else 1
    node_rank = int(os.environ.get("GROUP_RANK", str(rank // max(local_world, 1))))
    gpu_ids: list[int] = []
    if use_gpu:
        import torch

        if torch.cuda.is_available():
            gpu_ids = [local_rank]
    return WorkerInfo(
        world_rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank if world > 1 else 0,
        node_id=socket.gethostname(),
        node_ip=os.environ.get("MASTER_ADDR", "127.0.0.1") if rank == 0 else "127.0.0.1",
        pid=os.getpid(),
        gpu_ids=gpu_ids,
    )


@contextlib.contextmanager
def env(name: str, value: str) -> Iterator[None]:
    """Set ``os.environ[name]`` for the duration (restored after)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
