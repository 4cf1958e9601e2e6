"""The standby worker of a group: a warm spare actor that takes over a failed rank.

See ``WorkerGroupSpec.standby``: it reserves no resources (it runs only in place of a
dead worker, whose bundle it uses), imports ``warm_imports`` while it waits and
preloads each launched function, so a failed rank is back in well under a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from lumos.runtime._internal import messages
from lumos.runtime._internal.actor_factory import kill_quietly, new_worker_actor
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")

STANDBY_RESPAWN_DELAY_S = 5.0
"""After the standby took over a rank, the next one starts this much later (so that its
start-up does not compete for CPU with the restarted training)."""
STANDBY_WAIT_S = 60.0
"""How long a hand-over waits for a standby that is still warming up."""


@dataclass
class _Spare:
    actor: Any
    ready: Any  # ObjectRef of its setup call (returns its meta once warm)
    runtime_env: dict[str, Any] | None = None  # what it was started with


class Standby:
    """Starts, warms and hands over a group's spare worker (one at a time).

    Args:
        spec: The group's spec; nothing is started unless ``spec.uses_standby``.
        pg: The group's placement group; ``None`` for an elastic group, whose spare runs
            outside any placement group (on the node ``pick_node`` names).
        bundle_index: The bundle the spare runs in (rank 0's).
        pick_node: Without ``pg``: the node for the next spare (a node with room for
            one more worker, so that a grow lands there), ``None``: Ray chooses.
    """

    def __init__(
        self,
        spec: WorkerGroupSpec,
        pg: PlacementGroup | None,
        bundle_index: int,
        pick_node: Callable[[], str | None] | None = None,
    ) -> None:
        self._spec = spec
        self._pg = pg
        self._bundle_index = bundle_index
        self._pick_node = pick_node
        self._spare: _Spare | None = None
        self._due: float | None = None  # when to start the next spare
        self._closed = False

    def start(self) -> None:
        """Start a spare now (no-op without ``spec.uses_standby`` or after ``close``)."""
        self._due = None
        if not self._spec.uses_standby or self._closed:
            return
        opts: dict[str, Any] = {"num_cpus": 0}
        node = self._pick_node() if self._pg is None and self._pick_node is not None else None
        if node:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        actor = new_worker_actor(opts, self._pg, self._bundle_index, self._spec.runtime_env)
        env = dict(self._spec.env_vars)
        # Ray sets OMP_NUM_THREADS from an actor's CPUs; the standby reserves none.
        cpus = float(self._spec.resources_per_worker.get("CPU", 1.0))
        env.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))
        ready = actor.setup.remote(env, list(self._spec.warm_imports), True)
        self._spare = _Spare(actor, ready, self._spec.runtime_env)

    def node_id(self) -> str | None:
        """The node of the current spare once it is warm (``None``: none, or not yet)."""
        if self._spare is None:
            return None
        done, _ = ray.wait([self._spare.ready], timeout=0)
        if not done:
            return None
        try:
            meta: dict[str, Any] = ray.get(self._spare.ready, timeout=0)
        except Exception:
            return None
        return str(meta["node_id"])

    def start_if_due(self) -> None:
        """Start the next spare once its delay after a hand-over has passed."""
        if self._due is not None and time.monotonic() >= self._due:
            self.start()

    def preload(self, fn_key: str, fn_ref: Any, args_ref: Any) -> None:
        """Have the spare fetch a launched function and its arguments ahead of time."""
        if self._spare is not None:
            self._spare.actor.preload.remote(fn_key, [fn_ref], [args_ref])

    def ready_meta(self, timeout_s: float = STANDBY_WAIT_S) -> dict[str, Any] | None:
        """The current spare's setup metadata (``pid``, ``node_id``, ...) once it is warm.

        Returns ``None`` when there is no spare. Waits up to ``timeout_s`` for its warm-up.
        """
        if self._spare is None:
            return None
        meta: dict[str, Any] = ray.get(self._spare.ready, timeout=timeout_s)
        return meta

    def take(
        self, nodes: list[str | None], runtime_env: dict[str, Any] | None = None
    ) -> tuple[int, Any, dict[str, Any]] | None:
        """Hand the spare over for the first of ``nodes`` that is its node.

        Args:
            nodes: The nodes of the ranks to replace.
            runtime_env: The runtime environment the rank needs (default: the group's
                ``spec.runtime_env``); a spare started with another one never takes over.

        Returns:
            ``(index into nodes, actor, setup meta)``; ``None`` when there is no spare,
            it failed, it runs on another node or in another runtime environment (it is
            then killed and a new one started at the next ``start_if_due``).
        """
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        wanted = self._spec.runtime_env if runtime_env is None else runtime_env
        if (spare.runtime_env or {}) != (wanted or {}):
            logger.info(messages.STANDBY_OTHER_RUNTIME_ENV)
            kill_quietly(spare.actor)
            self._due = time.monotonic()
            return None
        try:
            meta: dict[str, Any] = ray.get(spare.ready, timeout=STANDBY_WAIT_S)
            ray.get(spare.actor.ping.remote(), timeout=STANDBY_WAIT_S)  # still alive
        except Exception as exc:
            logger.info("%s", messages.standby_unusable(exc))
        else:
            for index, node in enumerate(nodes):
                if node == meta["node_id"]:
                    self._due = time.monotonic() + STANDBY_RESPAWN_DELAY_S
                    return index, spare.actor, meta
        kill_quietly(spare.actor)
        self._due = time.monotonic()
        return None

    def close(self) -> None:
        """Kill the spare and start no other."""
        self._closed = True
        self._due = None
        if self._spare is not None:
            kill_quietly(self._spare.actor)
            self._spare = None
