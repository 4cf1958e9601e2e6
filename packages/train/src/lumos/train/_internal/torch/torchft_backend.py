"""The torchft backend: torchft's lighthouse in the driver, one replica group per worker.

Driver half (:class:`TorchftBackend`): the first launch starts torchft's
``LighthouseServer`` in the driver's process (``TorchftConfig.lighthouse_args``);
``shutdown`` (when ``fit()`` ends) stops it. It sets ``peer_recovery``, which makes the
controller replace a dead rank while the others keep training
(``controller/components/peer_recovery.py``). Worker half
(:class:`TorchftWorkerHooks`): no process group across the workers (each worker is
its own torchft replica group, whose ``ProcessGroupGloo`` torchft reconfigures every
quorum); the hooks publish the lighthouse address (``TORCHFT_LIGHTHOUSE``, as Ray
does) and the socket interface, and shut down the rank's torchft manager when the
function ends (``torchft_loop.py`` creates it).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from lumos.train._internal.backend import Backend
from lumos.train._internal.extras import require_extra
from lumos.train._internal.session import WorkerHooks
from lumos.train._internal.torch.interfaces import choose_socket_interface

if TYPE_CHECKING:
    from lumos.runtime import WorkerGroupProtocol
    from lumos.train._internal.torch.torchft_config import TorchftConfig
    from lumos.train._internal.train_context import TrainContext

logger = logging.getLogger("lumos.train")

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""Where a rank finds the lighthouse (Ray Train's ``TORCHFT_LIGHTHOUSE_ADDR_ENV_VAR``)."""

TIMEOUT_ENV = "LUMOS_TORCHFT_TIMEOUT_S"
"""``TorchftConfig.timeout_s`` for ``prepare_torchft``."""
JOINING_ENV = "LUMOS_TORCHFT_JOINING"
"""Set (``"1"``) on a rank launched alone into a running attempt: it meets no barrier."""

MANAGERS: dict[int, Any] = {}
"""The torchft manager each training thread created (``prepare_torchft``), by thread id."""


class TorchftWorkerHooks(WorkerHooks):
    """Worker half: the lighthouse address and socket interface; the manager's shutdown."""

    def __init__(
        self, lighthouse: str, backend: str, timeout_s: float, joining: bool = False
    ) -> None:
        self.lighthouse = lighthouse
        self.backend = backend
        self.timeout_s = timeout_s
        self.joining = joining  # a replacement: the others are training already

    def on_start(self, context: TrainContext) -> None:
        os.environ[LIGHTHOUSE_ENV] = self.lighthouse
        os.environ[TIMEOUT_ENV] = str(self.timeout_s)
        os.environ[JOINING_ENV] = "1" if self.joining else ""
        node_ip = context.get_worker_info().node_ip
        choose_socket_interface(self.backend, node_ip, node_ip, False, context.get_world_rank())
        importlib.import_module("torchft")  # seconds on a cold process: before the ranks meet

    def for_replacement(self) -> TorchftWorkerHooks:
        return TorchftWorkerHooks(self.lighthouse, self.backend, self.timeout_s, joining=True)

    def on_end(self, context: TrainContext, error: BaseException | None) -> None:
        import threading

        manager = MANAGERS.pop(threading.get_ident(), None)
        if manager is not None:
            try:  # its heartbeats stop: the others' next quorum goes on without this rank
                manager.shutdown(wait=False)
            except Exception:
                logger.debug("torchft manager shutdown failed", exc_info=True)


class TorchftBackend(Backend):
    """Driver half: starts torchft's lighthouse once, stops it at the end of ``fit()``."""

    # torch._dynamo: a process's first optimizer imports it (seconds on a busy host)
    warm_imports = ("torch", "torch.distributed", "torch._dynamo", "torchft")
    peer_recovery = True

    def __init__(self, config: TorchftConfig) -> None:
        self.config = config
        self._lighthouse: Any = None

    def lighthouse_address(self) -> str:
        """The running lighthouse's address (started on first use)."""
        if self._lighthouse is None:
            coordination = require_extra(
                "torchft.coordination", "torchft", "lumos.train.torch.TorchftConfig", "torchft"
            )
            self._lighthouse = coordination.LighthouseServer(**self.config.lighthouse_args())
        return str(self._lighthouse.address())

    def prepare_launch(self, group: WorkerGroupProtocol) -> WorkerHooks:
        return TorchftWorkerHooks(self.lighthouse_address(), "gloo", self.config.timeout_s)

    def shutdown(self) -> None:
        lighthouse, self._lighthouse = self._lighthouse, None
        if lighthouse is not None:
            lighthouse.shutdown()
