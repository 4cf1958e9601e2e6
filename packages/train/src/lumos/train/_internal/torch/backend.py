"""The torch backend: a ``torch.distributed`` process group around the user's function.

Driver half (:class:`TorchBackend`): the address is rank 0's node IP. Worker half
(:class:`TorchWorkerHooks`, runs in each training thread): every rank destroys a
process group left over from a failed attempt and, unless the user set
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, points the backend at the interface
holding its node IP (``interfaces.py``: the hostname's address is often loopback, which
peers on other hosts cannot reach); rank 0 starts the rendezvous
``TCPStore`` on a port the OS picks and broadcasts the port through the runtime
session (no extra driver round trip before the launch); the others connect to it,
every rank sets the usual env vars and joins the new group. When the function ends
(also by an error) the group is destroyed; after an error its gloo connections are
shut down first, so that peers blocked in a collective fail at once instead of
waiting for the timeout (or for this process to exit).
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any

from lumos.train._internal.backend import Backend
from lumos.train._internal.session import WorkerHooks
from lumos.train._internal.torch.interfaces import choose_socket_interface
from lumos.train._internal.train_context import TrainContext

if TYPE_CHECKING:
    from lumos.runtime import WorkerGroupProtocol
    from lumos.train._internal.torch.config import TorchConfig


def destroy_process_group_quietly() -> None:
    """Destroy the default process group if there is one (errors ignored)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a group whose peers died may fail to tear down cleanly
            pass


class TorchWorkerHooks(WorkerHooks):
    """Joins the process group in every training thread (picklable, plain values only)."""

    def __init__(
        self, backend: str, master_addr: str, timeout_s: float, multi_host: bool = False
    ) -> None:
        self.backend = backend
        self.master_addr = master_addr
        self.timeout_s = timeout_s
        self.multi_host = multi_host  # the group's workers are on more than one node
        self._group_sockets: set[int] = set()  # set by on_start in the worker
        self._store_port = -1

    def on_start(self, context: TrainContext) -> None:
        import torch
        import torch.distributed as dist

        from lumos.runtime import worker

        rank = context.get_world_rank()
        world = context.get_world_size()
        session = worker.get_session()
        assert session is not None
        timeout = datetime.timedelta(seconds=self.timeout_s)
        destroy_process_group_quietly()
        node_ip = context.get_worker_info().node_ip
        choose_socket_interface(self.backend, node_ip, self.master_addr, self.multi_host, rank)
        # Rank 0 starts the rendezvous store (on a port the OS picks) before it sends
        # the port, so the others connect at once: with init_method="tcp://..." they may
        # race the server and fall into torch's connect back-off (up to ~0.5 s seen).
        # Public API, re-exported by torch.distributed without an explicit ``as``.
        tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]
        store: Any = None
        if rank == 0:
            store = tcp_store(
                self.master_addr, 0, world, is_master=True, timeout=timeout, wait_for_workers=False
            )
            port = int(session.broadcast_from_rank_zero(int(store.port)))
        else:
            port = int(session.broadcast_from_rank_zero(None))
            store = tcp_store(self.master_addr, port, world, is_master=False, timeout=timeout)
        os.environ.update(
            {
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(context.get_local_rank()),
                "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
                "NODE_RANK": str(context.get_node_rank()),
            }
        )
        if self.backend == "nccl" and torch.cuda.is_available():
            torch.cuda.set_device(_local_device_index(context))
        before = _socket_fds()
        dist.init_process_group(
            backend=self.backend, store=store, rank=rank, world_size=world, timeout=timeout
        )
        # gloo's connections to the peers: what ``on_end`` tears down after an error
        self._group_sockets = (_socket_fds() - before) if self.backend == "gloo" else set()
        self._store_port = port

    def on_end(self, context: TrainContext, error: BaseException | None) -> None:
        if error is not None:
            # After an error, torch (2.13) may leave gloo's sockets open on destroy, so a
            # peer blocked in a collective would wait for this process to exit (or for
            # the timeout). Shutting the connections down fails its collective at once,
            # and the surviving processes can be reused (elastic shrink, restart).
            _shut_down_connections(self._group_sockets, self._store_port)
        destroy_process_group_quietly()


def _socket_fds() -> set[int]:
    """This process's socket file descriptors (Linux; elsewhere none are known)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    out = set()
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                out.add(int(name))
        except OSError:
            continue
    return out


def _shut_down_connections(fds: set[int], store_port: int) -> None:
    """``shutdown()`` the connected TCP sockets among ``fds`` (never a listening socket,
    which gloo cannot survive, nor the rendezvous store's connection)."""
    import socket

    for fd in sorted(fds):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # closed meanwhile
        try:
            if sock.type != socket.SOCK_STREAM or sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN
            ):
                continue
            ports = (sock.getsockname()[1], sock.getpeername()[1])
            if store_port not in ports:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected (any more), or not a TCP socket
        finally:
            sock.close()


def _local_device_index(context: TrainContext) -> int:
    import torch

    gpu_ids = context.get_worker_info().gpu_ids
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu_ids and visible:
        ids = [v.strip() for v in visible.split(",")]
        if str(gpu_ids[0]) in ids:
            return ids.index(str(gpu_ids[0]))
    return min(context.get_local_rank(), max(torch.cuda.device_count() - 1, 0))


class TorchBackend(Backend):
    """Driver half of the torch backend."""

    warm_imports = ("torch", "torch.distributed")

    def __init__(self, config: TorchConfig, use_gpu: bool) -> None:
        self.config = config
        self.use_gpu = use_gpu

    def prepare_launch(self, group: WorkerGroupProtocol) -> WorkerHooks:
        addr = str(group.workers[0].node_ip)
        backend = self.config.resolved_backend(self.use_gpu)
        multi_host = len({str(w.node_ip) for w in group.workers}) > 1
        return TorchWorkerHooks(backend, addr, self.config.timeout_s, multi_host)

    def process_group_backend(self) -> str:
        """The ``TorchConfig`` backend (gloo on CPU, nccl with GPUs) joined under torchrun."""
        return self.config.resolved_backend(self.use_gpu)
