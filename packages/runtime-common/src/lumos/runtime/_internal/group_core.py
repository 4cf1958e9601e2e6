"""The state of a ``WorkerGroup`` and the steps every one of its operations uses.

``GroupCore`` holds the group, rank by rank (actor, placement group and bundle,
message sequence number, ``WorkerInfo``), with the event multiplexer, the collective
relay, the standby and the preemption tracker. ``elastic_group.ElasticGroup`` adds the
in-place resizing on top; ``worker_group.WorkerGroup`` the start, the runs, the repair
and the shutdown.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup

from lumos.runtime._internal.actor_factory import kill_quietly
from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.elastic import PreemptionTracker, roomiest_node
from lumos.runtime._internal.errors import WorkerGroupError
from lumos.runtime._internal.multiplexer import EventMultiplexer
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec
from lumos.runtime._internal.standby import Standby


class GroupCore(ShutsDownOnExit):
    """A worker group's ranks and the primitives on them (see ``WorkerGroup``)."""

    def __init__(
        self,
        spec: WorkerGroupSpec,
        pg: PlacementGroup | None,
        actors: list[Any],
        bundles: list[int],
        infos: list[WorkerInfo],
        rank_pgs: list[PlacementGroup] | None = None,
    ) -> None:
        self.spec = spec
        self._pg: PlacementGroup | None = pg
        self._actors = actors
        self._bundles = bundles
        # Each rank's placement group: the one group's (fixed size), or its own (elastic).
        self._rank_pgs: list[PlacementGroup] = (
            list(rank_pgs) if rank_pgs is not None else [pg for _ in actors]  # type: ignore[misc]
        )
        self._preemption = PreemptionTracker()
        self.workers: list[WorkerInfo] = infos
        self._msg_seq = [0] * len(actors)
        self._seq_lock = threading.Lock()
        self._relay = CollectiveRelay(len(actors), self._send_control)
        self._mux = EventMultiplexer(spec.health_check_timeout_s, self._relay.handle)
        for rank, actor in enumerate(actors):
            self._mux.add(rank, actor, infos[rank].node_id)
        self._closed = False
        self._fn_counter = 0
        self._vacant: set[int] = set()  # ranks without a worker (``vacate_workers``)
        if spec.elastic:
            pick = functools.partial(roomiest_node, spec.resources_per_worker)
            self._standby = Standby(spec, None, 0, pick_node=pick)
        else:
            self._standby = Standby(spec, pg, bundles[0])

    def _sync_preemption(self, force: bool = False) -> None:
        """Send the group's current notice to every live worker when it changed."""
        info = self._preemption.current(self.workers)
        if info == self._preemption.sent and not (force and info is not None):
            return
        self._preemption.sent = info
        for rank, actor in enumerate(self._actors):
            if not self._mux.is_failed(rank):
                actor.mark_preempted.remote(self._next_seq(rank), info)

    def _kill_rank(self, rank: int) -> None:
        kill_quietly(self._actors[rank])
        if self._mux.is_hung(rank):
            # A hung (e.g. stopped) process cannot answer Ray's graceful kill, and Ray
            # waits seconds before forcing it; when it is on this node, end it now.
            info = self.workers[rank]
            if info.node_id == ray.get_runtime_context().get_node_id():
                try:
                    os.kill(info.pid, signal.SIGKILL)
                except OSError:
                    pass

    def _next_seq(self, rank: int) -> int:
        with self._seq_lock:
            seq = self._msg_seq[rank]
            self._msg_seq[rank] = seq + 1
            return seq

    def _send_control(self, ranks: list[int], key: tuple[str, int], value: Any) -> None:
        payload = ray.put(value) if value is not None and len(ranks) > 1 else value
        for r in ranks:
            if not self._mux.is_failed(r):
                self._actors[r].deliver_control.remote(key, payload)

    def _check_open(self) -> None:
        if self._closed:
            raise WorkerGroupError({}, "the worker group was shut down")
