"""Owner-side pieces of an elastic group: per-worker placement, and preemption tracking.

An elastic group (``WorkerGroupSpec(min_workers=...)``) gives each worker its own
one-bundle placement group, so a lost node's workers leave without touching the
others and new workers join without re-placing anyone. ``elastic_group.ElasticGroup``
resizes the group; this module places its workers (``start_elastic``, ``place_more``,
``roomiest_node`` for the standby) and tracks preemption notices (``PreemptionTracker``,
used by fixed-size groups too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group

from lumos.runtime._internal import messages
from lumos.runtime._internal.actor_factory import (
    new_worker_actor,
    release_quietly,
    remove_placement_group_quietly,
)
from lumos.runtime._internal.events import WorkerPreemptedEvent
from lumos.runtime._internal.pg_owner import creator_actor_id, placement_group_name
from lumos.runtime._internal.placement import actor_options
from lumos.runtime._internal.placement_wait import setup_results, wait_until_started
from lumos.runtime._internal.policies import FreeResources
from lumos.runtime._internal.preemption import DRAIN_POLL_INTERVAL_S, PreemptionInfo, draining_nodes
from lumos.runtime._internal.resize import read_free_resources
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")


def one_bundle_group(spec: WorkerGroupSpec, target_node: str | None = None) -> PlacementGroup:
    """A placement group for one worker (named for its creator, see ``pg_owner``).

    ``target_node`` is a soft wish (e.g. the standby's node); Ray places it elsewhere
    when that node has no room.
    """
    extra: dict[str, Any] = {}
    if target_node:
        extra["_soft_target_node_id"] = target_node
    pg: PlacementGroup = placement_group(
        [dict(spec.resources_per_worker)],
        strategy="STRICT_PACK" if target_node else spec.placement_strategy,
        name=placement_group_name(creator_actor_id()),
        **extra,
    )
    return pg


def start_elastic(
    spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None, env: dict[str, str] | None
) -> tuple[list[PlacementGroup], list[Any], list[dict[str, Any]]]:
    """Start between ``min_workers`` and ``num_workers`` workers, one placement group each.

    Waits (``placement_timeout_s``, "waiting for resources" lines) until ``min_workers``
    have started, then at most ``elastic_start_wait_s`` for the others to be placed (and
    for those placed, until their process started); the rest are released.

    Returns:
        ``(placement groups, actors, setup metas)`` of the started workers, same order.

    Raises:
        WorkerGroupStartError: ``min_workers`` did not start in time, or one failed.
    """
    assert spec.min_workers is not None
    opts = actor_options(spec.resources_per_worker)
    pgs: list[PlacementGroup] = []
    actors: list[Any] = []
    try:
        for _ in range(spec.num_workers):
            pg = one_bundle_group(spec)
            pgs.append(pg)
            actors.append(new_worker_actor(opts, pg, 0, spec.runtime_env))
        refs = [a.setup.remote(env, None, True) for a in actors]
        placed = [pg.ready() for pg in pgs]
        ready = wait_until_started(refs, spec.min_workers, spec, placed, on_waiting)
        ready |= _join_placed(refs, placed, ready, spec)
        keep = sorted(ready)
        metas = setup_results([refs[i] for i in keep])
    except BaseException:
        release_quietly(actors, pgs)
        raise
    gone = [i for i in range(len(refs)) if i not in ready]
    release_quietly([actors[i] for i in gone], [pgs[i] for i in gone])
    if len(keep) < spec.num_workers:
        logger.info("%s", messages.elastic_started(len(keep), spec.num_workers, spec.min_workers))
    return [pgs[i] for i in keep], [actors[i] for i in keep], metas


def _join_placed(
    refs: list[Any], placed: list[Any], ready: set[int], spec: WorkerGroupSpec
) -> set[int]:
    """The workers beyond ``ready`` whose placement group is placed within
    ``elastic_start_wait_s`` (their process may still be starting: that is waited for,
    up to ``placement_timeout_s``, not the capacity)."""
    rest = [i for i in range(len(refs)) if i not in ready]
    if not rest:
        return set()
    wanted = [placed[i] for i in rest]
    done, _ = ray.wait(wanted, num_returns=len(wanted), timeout=spec.elastic_start_wait_s)
    joining = [i for i in rest if placed[i] in done]
    if joining:
        ray.wait(
            [refs[i] for i in joining], num_returns=len(joining), timeout=spec.placement_timeout_s
        )
    return set(joining)


def place_more(
    spec: WorkerGroupSpec, count: int, timeout_s: float, target_node: str | None
) -> list[tuple[PlacementGroup, str]]:
    """Create ``count`` one-bundle placement groups; keep those placed within ``timeout_s``.

    The first one asks for ``target_node`` (softly). The others are removed.

    Returns:
        ``(placement group, node id)`` of each one placed.
    """
    pgs = [one_bundle_group(spec, target_node if i == 0 else None) for i in range(count)]
    ready_refs = [pg.ready() for pg in pgs]
    done, _ = ray.wait(ready_refs, num_returns=len(ready_refs), timeout=max(0.0, timeout_s))
    placed: list[tuple[PlacementGroup, str]] = []
    for pg, ref in zip(pgs, ready_refs, strict=True):
        node = _node_of(pg) if ref in done else None
        if node is None:
            remove_placement_group_quietly(pg)
        else:
            placed.append((pg, node))
    return placed


def roomiest_node(resources_per_worker: dict[str, float]) -> str | None:
    """The node with room for the most more workers (``None``: none has room); where an
    elastic group's standby waits, so that a grow lands there."""
    best: tuple[int, str] | None = None
    for node, res in read_free_resources().per_node.items():
        fit = FreeResources({node: res}).workers_that_fit(resources_per_worker)
        if fit > 0 and (best is None or fit > best[0]):
            best = (fit, node)
    return best[1] if best is not None else None


def _node_of(pg: PlacementGroup) -> str | None:
    try:
        table = ray.util.placement_group_table(pg)
        node = table.get("bundles_to_node_id", {}).get(0)
    except Exception:
        logger.debug("placement_group_table failed", exc_info=True)
        return None
    return str(node) if node else None


class PreemptionTracker:
    """Owner side: which of the group's workers are under a preemption notice.

    Two sources: nodes Ray marks as draining (read from the GCS at most every
    ``DRAIN_POLL_INTERVAL_S``) and worker processes that got SIGTERM (their own
    ``WorkerPreemptedEvent``). A worker is known by ``(node_id, pid)``, so a notice
    survives the re-numbering of a resize.
    """

    def __init__(self, interval_s: float = DRAIN_POLL_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._next_check = 0.0
        self._drains: dict[str, int] = {}
        self._sigterm: dict[tuple[str, int], int] = {}
        self._announced: set[tuple[str, str, int]] = set()  # (source, node, pid)
        self.sent: PreemptionInfo | None = None
        """What the workers were last told (``None``: nothing)."""

    def seconds_to_next_check(self, now: float) -> float:
        return max(0.0, self._next_check - now)

    def check_drains(self, workers: list[WorkerInfo], now: float) -> list[WorkerPreemptedEvent]:
        """Read the draining nodes when due; an event per newly affected rank."""
        if now < self._next_check:
            return []
        self._next_check = now + self.interval_s
        ours = {w.node_id for w in workers}
        self._drains = {n: d for n, d in draining_nodes().items() if n in ours}
        events: list[WorkerPreemptedEvent] = []
        for w in workers:
            deadline = self._drains.get(w.node_id)
            key = ("drain", w.node_id, w.pid)
            if deadline is not None and key not in self._announced:
                self._announced.add(key)
                events.append(
                    WorkerPreemptedEvent(w.world_rank, w.node_id, deadline or None, "node draining")
                )
        return events

    def record_sigterm(self, worker: WorkerInfo, deadline_ms: int | None) -> bool:
        """Note a SIGTERM notice of ``worker``; False when it was known already."""
        key = ("sigterm", worker.node_id, worker.pid)
        self._sigterm[(worker.node_id, worker.pid)] = deadline_ms or 0
        if key in self._announced:
            return False
        self._announced.add(key)
        return True

    def current(self, workers: list[WorkerInfo]) -> PreemptionInfo | None:
        """The group's notice now: affected ranks per node and the earliest deadline."""
        node_to_ranks: dict[str, list[int]] = {}
        deadlines: list[int] = []
        for w in workers:
            drain = self._drains.get(w.node_id)
            term = self._sigterm.get((w.node_id, w.pid))
            if drain is None and term is None:
                continue
            node_to_ranks.setdefault(w.node_id, []).append(w.world_rank)
            deadlines += [d for d in (drain, term) if d]
        if not node_to_ranks:
            return None
        return PreemptionInfo(min(deadlines, default=None), node_to_ranks)
