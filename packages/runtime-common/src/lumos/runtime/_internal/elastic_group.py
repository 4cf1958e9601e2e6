"""A ``WorkerGroup``'s elastic operations: the elastic start and resizing in place.

An elastic group (``WorkerGroupSpec(min_workers=...)``) starts with as many workers
as fit, one placement group each (``elastic.start_elastic``), and later drops ranks
(``remove_workers``) or adds them (``add_workers``) without touching the others.
Jobs whose ranks go on training while others leave and join (per-step fault
tolerance: every rank its own torchft replica) resize without re-numbering:
``vacate_workers`` leaves a rank without a worker, ``refill_workers`` places a new
worker into a vacant rank, or moves a live one (a preemption notice).
``free_resources`` and ``scaling_state`` are what a ``ScalingPolicy`` decides from.
``ElasticGroup`` adds these to ``GroupCore``; ``WorkerGroup`` is built on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup

from lumos.runtime._internal import messages
from lumos.runtime._internal.actor_factory import release_quietly, remove_placement_group_quietly
from lumos.runtime._internal.elastic import place_more, start_elastic
from lumos.runtime._internal.errors import RuntimeUsageError
from lumos.runtime._internal.group_core import GroupCore
from lumos.runtime._internal.placement import assign_ranks, infos_keep_ranks, meta_of
from lumos.runtime._internal.placement_wait import start_workers
from lumos.runtime._internal.policies import FreeResources, GroupState
from lumos.runtime._internal.resize import ResizeResult, group_state, read_free_resources
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")

_Group = TypeVar("_Group", bound="ElasticGroup")


class ElasticGroup(GroupCore):
    """``GroupCore`` with the elastic start and in-place resizing (see ``WorkerGroup``)."""

    @classmethod
    def _start_elastic(
        cls: type[_Group], spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None
    ) -> _Group:
        """Between ``min_workers`` and ``num_workers`` workers, one placement group each."""
        pgs, actors, metas = start_elastic(spec, on_waiting, dict(spec.env_vars) or None)
        try:
            owner_node = ray.get_runtime_context().get_node_id()
            order, infos = assign_ranks(metas, owner_node)
        except BaseException:
            release_quietly(actors, pgs)
            raise
        group = cls(
            spec,
            None,
            [actors[i] for i in order],
            [0] * len(order),
            infos,
            rank_pgs=[pgs[i] for i in order],
        )
        group._standby.start()
        return group

    def remove_workers(self, ranks: list[int]) -> ResizeResult:
        """Shrink: end the workers of ``ranks`` (dead or alive) and re-number the others.

        The survivors keep their processes (what they imported stays) and their
        relative order; world ranks become ``0..n-1`` again and ``.workers`` is
        refreshed. Each removed worker's placement group is released. Call it between
        launches (after every rank's function ended); then ``launch`` again, so the
        process group is formed anew with the new size.

        Args:
            ranks: World ranks to remove; at least one worker must stay.

        Returns:
            The change (``old_to_new`` for the survivors).

        Raises:
            RuntimeUsageError: The group is not elastic (``WorkerGroupSpec.min_workers``),
                a rank is out of range, or no worker would stay.
        """
        self._check_open()
        t0 = time.monotonic()
        self._require_elastic("remove_workers")
        gone = sorted(set(ranks))
        bad = [r for r in gone if not 0 <= r < len(self._actors)]
        if bad or len(gone) >= len(self._actors):
            raise RuntimeUsageError(
                f"remove_workers(ranks={ranks!r}) is invalid: ranks must be in 0..{len(self._actors) - 1} "
                "and at least one worker must stay"
            )
        for rank in gone:
            self._kill_rank(rank)
            remove_placement_group_quietly(self._rank_pgs[rank])
        keep = [r for r in range(len(self._actors)) if r not in gone]
        mapping = {old: new for new, old in enumerate(keep)}
        self._mux.rekey(mapping)
        self._vacant = {mapping[r] for r in self._vacant if r in mapping}
        self._actors = [self._actors[r] for r in keep]
        self._rank_pgs = [self._rank_pgs[r] for r in keep]
        self._bundles = [self._bundles[r] for r in keep]
        self._msg_seq = [self._msg_seq[r] for r in keep]
        self.workers = infos_keep_ranks([meta_of(self.workers[r]) for r in keep])
        self._after_resize()
        return ResizeResult(
            old_to_new=mapping,
            removed=gone,
            world_size=len(self._actors),
            elapsed_s=time.monotonic() - t0,
        )

    def add_workers(self, count: int, timeout_s: float = 0.0) -> ResizeResult:
        """Grow: add up to ``count`` workers, as many as can be placed within ``timeout_s``.

        Each new worker gets its own one-bundle placement group; where one lands on
        the warm standby's node, the standby takes that rank (no cold start). New
        workers get the next world ranks; the others keep theirs (and their processes).
        The running ranks are not disturbed (the new workers idle until the next
        ``launch``), so an owner can add workers while training goes on and relaunch at
        the new size at the next checkpoint: the start-up cost is hidden. Never more
        than ``num_workers`` (the maximum) in all.

        Args:
            count: How many to add (>= 1).
            timeout_s: How long to wait for placement (0: only what fits now).

        Returns:
            The change (``added``: the new ranks; ``from_standby``: those the standby took).

        Raises:
            RuntimeUsageError: The group is not elastic or ``count`` is invalid.
            WorkerGroupStartError: A placed worker failed to start (it is released).
        """
        self._check_open()
        t0 = time.monotonic()
        self._require_elastic("add_workers")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise RuntimeUsageError(f"add_workers(count={count!r}) is invalid: must be an int >= 1")
        count = min(count, self.spec.num_workers - len(self._actors))
        n0 = len(self._actors)
        same = {r: r for r in range(n0)}
        if count <= 0:
            return ResizeResult(same, world_size=n0, elapsed_s=time.monotonic() - t0)
        placed = place_more(self.spec, count, timeout_s, self._standby.node_id())
        if not placed:
            return ResizeResult(same, world_size=n0, elapsed_s=time.monotonic() - t0)
        actors, metas, by_standby = self._fill(placed)
        for i, (pg, _node) in enumerate(placed):
            rank = n0 + i
            self._actors.append(actors[i])
            self._rank_pgs.append(pg)
            self._bundles.append(0)
            self._msg_seq.append(0)
            self._mux.add(rank, actors[i], metas[i]["node_id"])
        old = [meta_of(info) for info in self.workers]
        self.workers = infos_keep_ranks(old + metas)
        self._after_resize()
        added = list(range(n0, n0 + len(placed)))
        return ResizeResult(
            old_to_new=same,
            added=added,
            from_standby=[n0 + i for i in by_standby],
            world_size=len(self._actors),
            elapsed_s=time.monotonic() - t0,
        )

    def vacate_workers(self, ranks: list[int]) -> ResizeResult:
        """Shrink in place: end the workers of ``ranks`` (dead or alive) and release their
        placement groups; no rank is re-numbered.

        For jobs whose ranks go on while others leave (per-step fault tolerance: each
        rank is its own torchft replica): the running functions keep their world rank.
        A vacant rank gets no launch, message or event; ``scaling_state`` counts it as
        lost; ``refill_workers`` places a new worker there, ``remove_workers`` drops it.
        A launch on every rank is refused while a rank is vacant.

        Args:
            ranks: World ranks to vacate; at least one worker must stay.

        Returns:
            The change (``removed``: the vacated ranks; ``world_size``: the number of
            ranks, vacant ones included).

        Raises:
            RuntimeUsageError: The group is not elastic, a rank is out of range, or no
                worker would stay.
        """
        self._check_open()
        t0 = time.monotonic()
        self._require_elastic("vacate_workers")
        gone = sorted(set(ranks))
        n = len(self._actors)
        if any(not 0 <= r < n for r in gone) or not set(range(n)) - self._vacant - set(gone):
            raise RuntimeUsageError(
                f"vacate_workers(ranks={ranks!r}) is invalid: ranks must be in 0..{n - 1} "
                "and at least one worker must stay"
            )
        for rank in gone:
            self._kill_rank(rank)
            self._mux.remove(rank)
            remove_placement_group_quietly(self._rank_pgs[rank])
        self._vacant |= set(gone)
        self._relay.excuse(gone)
        self._sync_preemption(force=True)
        live = {r: r for r in range(n) if r not in self._vacant}
        return ResizeResult(live, removed=gone, world_size=n, elapsed_s=time.monotonic() - t0)

    def refill_workers(self, ranks: list[int], timeout_s: float = 0.0) -> ResizeResult:
        """Give ``ranks`` new workers: as many as can be placed within ``timeout_s``, in
        the order given; no rank is re-numbered and no other worker is touched.

        A vacant rank (``vacate_workers``) is filled. A live rank moves: its new worker
        is started first (Ray places nothing on a draining node), then its old worker
        is ended, with its function, and the new one takes its rank (a preemption
        notice's move, for jobs whose other ranks go on meanwhile). Each new worker
        gets a placement group of its own (the warm standby takes a rank where one is
        placed on its node) and idles until ``launch(ranks=...)``. A fixed-size group
        may move its ranks too (only an elastic one has vacant ranks); the bundle a moved
        rank leaves in the group's placement group stays reserved until the group ends.

        Args:
            ranks: World ranks to give a new worker.
            timeout_s: How long to wait for placement (0: only what fits now).

        Returns:
            The change (``added``: the ranks that got a new worker; ``from_standby``).

        Raises:
            RuntimeUsageError: A rank is out of range.
            WorkerGroupStartError: A placed worker failed to start (it is released).
        """
        self._check_open()
        t0 = time.monotonic()
        n = len(self._actors)
        wanted = list(dict.fromkeys(ranks))
        if any(not 0 <= r < n for r in wanted):
            raise RuntimeUsageError(
                f"refill_workers(ranks={ranks!r}) is invalid: ranks must be in 0..{n - 1}"
            )
        placed = []
        if wanted:
            placed = place_more(self.spec, len(wanted), timeout_s, self._standby.node_id())
        filled, from_standby = self._seat(wanted[: len(placed)], placed) if placed else ([], [])
        return ResizeResult(
            {r: r for r in range(n) if r not in self._vacant},
            added=filled,
            from_standby=from_standby,
            world_size=n,
            elapsed_s=time.monotonic() - t0,
        )

    def _seat(
        self, ranks: list[int], placed: list[tuple[PlacementGroup, str]]
    ) -> tuple[list[int], list[int]]:
        """Start a worker in each of ``placed`` and give it the rank of the same index
        (ending the rank's old worker); returns ``(ranks, those the standby took)``."""
        actors, metas, by_standby = self._fill(placed)
        old = [meta_of(info) for info in self.workers]
        for i, rank in enumerate(ranks):
            self._kill_rank(rank)  # a live rank moves; a vacant one's actor is gone already
            self._mux.remove(rank)
            if rank not in self._vacant and self._rank_pgs[rank] is not self._pg:
                remove_placement_group_quietly(self._rank_pgs[rank])  # its own (elastic, moved)
            self._vacant.discard(rank)
            self._actors[rank], self._rank_pgs[rank] = actors[i], placed[i][0]
            self._bundles[rank], self._msg_seq[rank] = 0, 0
            self._mux.add(rank, actors[i], metas[i]["node_id"])
            old[rank] = metas[i]
        self.workers = infos_keep_ranks(old)
        self._relay.excuse(ranks)
        self._after_resize()
        return ranks, [ranks[i] for i in by_standby]

    def _fill(
        self, placed: list[tuple[PlacementGroup, str]]
    ) -> tuple[list[Any], list[dict[str, Any]], list[int]]:
        """One worker per placed group: the standby where it fits, new actors elsewhere."""
        actors: dict[int, Any] = {}
        metas: dict[int, dict[str, Any]] = {}
        taken = self._standby.take([node for _, node in placed])
        if taken is not None:
            index, actor, meta = taken
            actors[index], metas[index] = actor, meta
            logger.info("%s", messages.standby_joined(meta["pid"]))
        fresh = [i for i in range(len(placed)) if i not in actors]
        # a grow runs while the others train: import what the standby would (torch) now,
        # not at the relaunch where every rank waits for the slowest
        warm = list(self.spec.warm_imports) or None
        try:
            started = start_workers(self.spec, [(placed[i][0], 0) for i in fresh], warm)
        except BaseException:
            release_quietly(actors.values(), [pg for pg, _ in placed])
            raise
        for i, actor, meta in zip(fresh, *started, strict=True):
            actors[i], metas[i] = actor, meta
        order = range(len(placed))
        return (
            [actors[i] for i in order],
            [metas[i] for i in order],
            sorted(set(actors) - set(fresh)),
        )

    def free_resources(self) -> FreeResources:
        """Free resources of the cluster's schedulable nodes (draining ones apart), for a
        ``ScalingPolicy``; the group's own workers are not counted as free."""
        self._check_open()
        return read_free_resources()

    def scaling_state(self, lost_ranks: list[int] | None = None) -> GroupState:
        """The group as a ``ScalingPolicy`` sees it (``lost_ranks``: failed, not replaced)."""
        notice = self._preemption.current(self.workers)
        lost = sorted(set(lost_ranks or ()) | self._vacant)
        return group_state(self.spec, len(self._actors), notice, lost)

    def _require_elastic(self, what: str) -> None:
        if not self.spec.elastic:
            raise RuntimeUsageError(
                f"{what}() needs an elastic group: start it with WorkerGroupSpec(min_workers=...) "
                "(a fixed-size group replaces failed ranks with replace_workers())"
            )

    def _after_resize(self) -> None:
        # The relay's size changes at the next launch: ranks still running (add_workers
        # while training goes on) keep their barrier size.
        self._sync_preemption(force=True)
