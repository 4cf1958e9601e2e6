"""WorkerGroup: a gang of worker actors in one placement group, with ranks.

The actors come from ``actor_factory``, the wait for their placement from
``placement_wait`` and the spare worker from ``standby``; this module holds the group.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group

from lumos.runtime._internal.actor_factory import (
    kill_quietly,
    new_worker_actor,
    remote_error_from_ray,
    remove_placement_group_quietly,
)
from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.elastic import PreemptionTracker, place_more, start_elastic
from lumos.runtime._internal.errors import (
    RemoteError,
    RuntimeConfigError,
    RuntimeUsageError,
    WorkerGroupError,
)
from lumos.runtime._internal.events import Event, WorkerPreemptedEvent
from lumos.runtime._internal.multiplexer import EventMultiplexer
from lumos.runtime._internal.pg_owner import creator_actor_id, placement_group_name
from lumos.runtime._internal.placement import actor_options, assign_ranks, infos_keep_ranks
from lumos.runtime._internal.placement_wait import wait_for_setup
from lumos.runtime._internal.policies import FreeResources, GroupState
from lumos.runtime._internal.preemption import PreemptionInfo
from lumos.runtime._internal.ray_init import ensure_ray
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.resize import ResizeResult, read_free_resources
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec
from lumos.runtime._internal.standby import Standby

logger = logging.getLogger("lumos.runtime")

T = TypeVar("T")


class WorkerGroup(ShutsDownOnExit):
    """N worker actors in a placement group, one per rank; owner side.

    Create it with ``WorkerGroup.start(spec)``. Use it as a context manager so the
    actors and the placement group are released also when the owner raises.

    Example:
        >>> with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
        ...     group.launch(train_fn, kwargs={"epochs": 3})
        ...     done = 0
        ...     while done < 2:
        ...         for event in group.poll(timeout_s=1.0):
        ...             done += isinstance(event, FinishedEvent)
    """

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
        if spec.elastic:
            self._standby = Standby(spec, None, 0, pick_node=self._node_for_spare)
        else:
            self._standby = Standby(spec, pg, bundles[0])

    # -- start ------------------------------------------------------------------------
    @classmethod
    def start(
        cls, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
    ) -> WorkerGroup:
        """Create the placement group and the actors; wait until each reports its node.

        The placement group is named ``lumos-wg-<creator actor id or 'driver'>-<uuid>``
        so that the owner of a creating actor (``WorkerPool``) can remove it when that
        actor dies (Ray keeps placement groups until the job ends).

        Args:
            spec: What to start.
            on_waiting: Called with a one-line message ("waiting for resources: ...",
                naming what is requested and what the cluster has free) when the
                workers are not all running after ~3 s, then every ~15 s while still
                waiting. The same line is logged on the ``lumos.runtime`` logger (INFO).
                Exceptions it raises are logged and ignored.

        Raises:
            WorkerGroupStartError: Placement timed out or an actor failed to start;
                everything created is released first.
        """
        ensure_ray()
        if spec.elastic:
            return cls._start_elastic(spec, on_waiting)
        bundles = [dict(spec.resources_per_worker) for _ in range(spec.num_workers)]
        pg = placement_group(
            bundles,
            strategy=spec.placement_strategy,
            name=placement_group_name(creator_actor_id()),
        )
        actors: list[Any] = []
        try:
            opts = actor_options(spec.resources_per_worker)
            for i in range(spec.num_workers):
                actors.append(new_worker_actor(opts, pg, i, spec.runtime_env))
            env = dict(spec.env_vars) or None
            refs = [a.setup.remote(env, None, True) for a in actors]  # SIGTERM: a notice
            metas = wait_for_setup(refs, spec, on_waiting)
            owner_node = ray.get_runtime_context().get_node_id()
            order, infos = assign_ranks(metas, owner_node)
        except BaseException:
            for a in actors:
                kill_quietly(a)
            remove_placement_group_quietly(pg)
            raise
        group = cls(spec, pg, [actors[i] for i in order], list(order), infos)
        group._standby.start()
        return group

    @classmethod
    def _start_elastic(
        cls, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None
    ) -> WorkerGroup:
        """Between ``min_workers`` and ``num_workers`` workers, one placement group each."""
        pgs, actors, metas = start_elastic(spec, on_waiting, dict(spec.env_vars) or None)
        try:
            owner_node = ray.get_runtime_context().get_node_id()
            order, infos = assign_ranks(metas, owner_node)
        except BaseException:
            for a in actors:
                kill_quietly(a)
            for g in pgs:
                remove_placement_group_quietly(g)
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

    # -- run --------------------------------------------------------------------------
    def launch(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        per_rank_kwargs: list[dict[str, Any]] | None = None,
        session_info: dict[str, Any] | None = None,
    ) -> None:
        """Start ``fn(*args, **kwargs, **per_rank_kwargs[rank])`` in a thread on every worker.

        Returns at once; the outcome arrives as events from ``poll``. Inside that thread
        ``lumos.runtime.worker.get_session()`` is the worker's WorkerSession.

        Args:
            fn: The user function (pickled once, ``ray.put`` once).
            args: Positional args for every rank.
            kwargs: Keyword args for every rank.
            per_rank_kwargs: One dict per rank, merged over ``kwargs``.
            session_info: Free-form dict exposed as ``session.session_info``.
        """
        self._check_open()
        if per_rank_kwargs is not None and len(per_rank_kwargs) != len(self._actors):
            raise RuntimeConfigError(
                f"per_rank_kwargs has {len(per_rank_kwargs)} entries: need one per worker ({len(self._actors)})"
            )
        self._relay.world_size = len(self._actors)  # the size may have changed (elastic)
        self._relay.reset()
        self._fn_counter += 1
        fn_key = f"{id(self)}:{self._fn_counter}"
        fn_ref = ray.put(fn)
        args_ref = ray.put((tuple(args), dict(kwargs or {})))
        self._standby.preload(fn_key, fn_ref, args_ref)
        for rank, actor in enumerate(self._actors):
            if self._mux.is_failed(rank):
                continue
            extra = per_rank_kwargs[rank] if per_rank_kwargs is not None else None
            actor.launch.remote(
                self._next_seq(rank),
                fn_key,
                [fn_ref],
                [args_ref],
                extra,
                self.workers[rank],
                session_info,
            )

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Events from all workers; blocks until at least one or ``timeout_s``.

        Per-worker order is preserved. Barrier / broadcast requests are served here and
        never returned. A dead actor yields ``WorkerDiedEvent`` at once; a worker whose
        long-poll is overdue by ``health_check_timeout_s`` yields ``WorkerHungEvent``.
        A failed worker is not polled again (replace it or shut the group down).

        A preemption notice yields ``WorkerPreemptedEvent`` once per affected rank: a
        node Ray marks as draining (read from the GCS about every second while
        polling) or a worker process that got SIGTERM. It is not a failure: the worker
        keeps running, and every rank's ``WorkerSession.preemption_info()`` now returns
        the group's notice (``preemption_info()`` here).
        """
        self._check_open()
        self._standby.start_if_due()
        start = time.monotonic()
        deadline = None if timeout_s is None else start + max(0.0, timeout_s)
        while True:
            now = time.monotonic()
            events: list[Event] = list(self._preemption.check_drains(self.workers, now))
            wait_s = self._preemption.seconds_to_next_check(now)
            if deadline is not None:
                wait_s = min(wait_s, max(0.0, deadline - now))
            if events:
                wait_s = 0.0
            events += self._mux.poll(wait_s)
            notices = [e for e in events if isinstance(e, WorkerPreemptedEvent)]
            if notices:
                events = self._on_notices(events, notices)
            if events or (deadline is not None and time.monotonic() >= deadline):
                return events
            if all(self._mux.is_failed(r) for r in range(len(self._actors))):
                return []

    def _on_notices(self, events: list[Event], notices: list[WorkerPreemptedEvent]) -> list[Event]:
        """Record SIGTERM notices (dropping repeats) and tell every rank the group's notice."""
        out: list[Event] = []
        for e in events:
            if isinstance(e, WorkerPreemptedEvent) and e.reason == "SIGTERM":
                if not 0 <= e.rank < len(self.workers):
                    continue
                if not self._preemption.record_sigterm(self.workers[e.rank], e.deadline_ms):
                    continue
            out.append(e)
        self._sync_preemption()
        return out

    def _sync_preemption(self, force: bool = False) -> None:
        """Send the group's current notice to every live worker when it changed."""
        info = self._preemption.current(self.workers)
        if info == self._preemption.sent and not (force and info is not None):
            return
        self._preemption.sent = info
        for rank, actor in enumerate(self._actors):
            if not self._mux.is_failed(rank):
                actor.mark_preempted.remote(self._next_seq(rank), info)

    def preemption_info(self) -> PreemptionInfo | None:
        """The group's current preemption notice (owner side), or ``None``.

        The ranks per node of the workers under a notice (draining node or SIGTERM) and
        the earliest deadline; the same value the workers' sessions return.
        """
        return self._preemption.current(self.workers)

    def send(self, value: Any, ranks: list[int] | None = None) -> None:
        """Deliver ``value`` to the inbox of ``ranks`` (all by default), ordered per worker."""
        self._check_open()
        targets = list(range(len(self._actors))) if ranks is None else list(ranks)
        payload = ray.put(value) if len(targets) > 1 else value
        for rank in targets:
            self._actors[rank].deliver.remote(self._next_seq(rank), payload)

    def request_stop(self) -> None:
        """Set every worker session's stop flag (wakes ``receive``/``barrier``)."""
        if self._closed:
            return
        for rank, actor in enumerate(self._actors):
            if not self._mux.is_failed(rank):
                actor.request_stop.remote(self._next_seq(rank))

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> list[T]:
        """Run ``fn(*args, **kwargs)`` on every worker (in the actor, not the user thread).

        Returns:
            The results, index == rank.

        Raises:
            WorkerGroupError: Holding every failed rank's RemoteError.
        """
        self._check_open()
        fn_ref = ray.put(fn)
        refs = [a.execute_tagged.remote(fn_ref, args, kwargs) for a in self._actors]
        results: list[Any] = [None] * len(refs)
        errors: dict[int, RemoteError] = {}
        for rank, ref in enumerate(refs):
            try:
                ok, value = ray.get(ref)
            except (RayActorError, RayTaskError) as exc:
                errors[rank] = remote_error_from_ray(exc, rank)
                continue
            if ok:
                results[rank] = value
            else:
                errors[rank] = value.with_rank(rank)
        if errors:
            raise WorkerGroupError(errors)
        return results

    def execute_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Like ``execute`` but returns one ObjectRef per rank (``ray.get`` them)."""
        self._check_open()
        fn_ref = ray.put(fn)
        return [a.execute.remote(fn_ref, args, kwargs) for a in self._actors]

    def execute_single(self, rank: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on one worker and return its result.

        Raises:
            WorkerGroupError: The call failed (holds that rank's RemoteError).
        """
        self._check_open()
        try:
            ok, value = ray.get(self._actors[rank].execute_tagged.remote(fn, args, kwargs))
        except (RayActorError, RayTaskError) as exc:
            raise WorkerGroupError({rank: remote_error_from_ray(exc, rank)}) from exc
        if not ok:
            raise WorkerGroupError({rank: value.with_rank(rank)})
        result: T = value
        return result

    # -- repair -----------------------------------------------------------------------
    def replace_workers(self, ranks: list[int]) -> list[int]:
        """Kill the actors of ``ranks`` and start new ones in the same bundles.

        Survivors keep their processes. ``.workers`` is refreshed (node info of the
        new actors); world ranks do not change.

        Returns:
            The ranks the standby worker took over (see ``WorkerGroupSpec.standby``).

        Raises:
            WorkerGroupStartError: A replacement could not be started in time.
        """
        self._check_open()
        ranks = sorted(set(ranks))
        for rank in ranks:
            self._kill_rank(rank)
            self._mux.remove(rank)
        new, by_rank, from_standby = self._start_replacements(ranks)
        metas = [by_rank.get(rank) or _meta_of(info) for rank, info in enumerate(self.workers)]
        for rank in ranks:
            self._actors[rank] = new[rank]
            self._msg_seq[rank] = 0
            self._mux.add(rank, new[rank], by_rank[rank]["node_id"])
        self.workers = infos_keep_ranks(metas)
        self._relay.reset()
        return from_standby

    def _start_replacements(
        self, ranks: list[int]
    ) -> tuple[dict[int, Any], dict[int, dict[str, Any]], list[int]]:
        """New actors for ``ranks`` (the standby first): ``(actors, setup metas, the
        ranks the standby took)``, each dict by rank."""
        new: dict[int, Any] = {}
        standby_meta: dict[int, dict[str, Any]] = {}
        taken = self._standby.take([self.workers[r].node_id for r in ranks])
        if taken is not None:
            index, actor, meta = taken
            new[ranks[index]] = actor
            standby_meta[ranks[index]] = meta
            logger.info("rank %d: the standby worker (pid %s) took over", ranks[index], meta["pid"])
        fresh = [r for r in ranks if r not in standby_meta]
        opts = actor_options(self.spec.resources_per_worker)
        for rank in fresh:
            new[rank] = new_worker_actor(
                opts, self._rank_pgs[rank], self._bundles[rank], self.spec.runtime_env
            )
        env = dict(self.spec.env_vars) or None
        refs = [new[r].setup.remote(env, None, True) for r in fresh]
        try:
            metas_new = wait_for_setup(refs, self.spec)
        except BaseException:
            for a in new.values():
                kill_quietly(a)
            raise
        by_rank = dict(zip(fresh, metas_new, strict=True)) | standby_meta
        return new, by_rank, sorted(standby_meta)

    # -- elastic resize ---------------------------------------------------------------
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
        self._actors = [self._actors[r] for r in keep]
        self._rank_pgs = [self._rank_pgs[r] for r in keep]
        self._bundles = [self._bundles[r] for r in keep]
        self._msg_seq = [self._msg_seq[r] for r in keep]
        self.workers = infos_keep_ranks([_meta_of(self.workers[r]) for r in keep])
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
        old = [_meta_of(info) for info in self.workers]
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
            logger.info("the standby worker (pid %s) joined the group", meta["pid"])
        fresh = [i for i in range(len(placed)) if i not in actors]
        opts = actor_options(self.spec.resources_per_worker)
        for i in fresh:
            actors[i] = new_worker_actor(opts, placed[i][0], 0, self.spec.runtime_env)
        env = dict(self.spec.env_vars) or None
        # a grow runs while the others train: import what the standby would (torch) now,
        # not at the relaunch where every rank waits for the slowest
        warm = list(self.spec.warm_imports) or None
        refs = [actors[i].setup.remote(env, warm, True) for i in fresh]
        try:
            for i, meta in zip(fresh, wait_for_setup(refs, self.spec), strict=True):
                metas[i] = meta
        except BaseException:
            for a in actors.values():
                kill_quietly(a)
            for pg, _ in placed:
                remove_placement_group_quietly(pg)
            raise
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
        info = self._preemption.current(self.workers)
        return GroupState(
            num_workers=len(self._actors),
            min_workers=self.spec.min_workers or self.spec.num_workers,
            max_workers=self.spec.num_workers,
            resources_per_worker=dict(self.spec.resources_per_worker),
            preempted_ranks=tuple(info.preempted_ranks) if info is not None else (),
            lost_ranks=tuple(sorted(set(lost_ranks or ()))),
        )

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

    def _node_for_spare(self) -> str | None:
        """A node with room for one more worker (elastic standby): the roomiest."""
        free = read_free_resources()
        best: tuple[int, str] | None = None
        for node, res in free.per_node.items():
            fit = FreeResources({node: res}).workers_that_fit(self.spec.resources_per_worker)
            if fit > 0 and (best is None or fit > best[0]):
                best = (fit, node)
        return best[1] if best is not None else None

    # -- shutdown ---------------------------------------------------------------------
    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Ask user threads to stop, wait up to ``grace_period_s``, kill the actors and
        remove the placement group. Idempotent; never raises for dead workers."""
        if self._closed:
            return
        self._closed = True
        try:
            live = [(r, a) for r, a in enumerate(self._actors) if not self._mux.is_failed(r)]
            if grace_period_s > 0 and live:
                for r, a in live:
                    a.request_stop.remote(self._next_seq(r))
                joins = [a.join.remote(grace_period_s) for _, a in live]
                try:
                    ray.wait(joins, num_returns=len(joins), timeout=grace_period_s + 1.0)
                except Exception:
                    logger.debug("waiting for user threads failed", exc_info=True)
        finally:
            for rank in range(len(self._actors)):
                self._kill_rank(rank)
            self._standby.close()
            self._mux.clear()
            if self._pg is not None:
                remove_placement_group_quietly(self._pg)
                self._pg = None
            if self.spec.elastic:
                for pg in self._rank_pgs:  # one per rank
                    remove_placement_group_quietly(pg)
            self._rank_pgs = []

    # -- helpers ----------------------------------------------------------------------
    @property
    def placement_group(self) -> PlacementGroup | None:
        """The Ray placement group (``None`` after shutdown); rank 0's for an elastic group."""
        if self._pg is None and self._rank_pgs and not self._closed:
            return self._rank_pgs[0]
        return self._pg

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, index == rank (for advanced use and tests)."""
        return list(self._actors)

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


def _meta_of(info: WorkerInfo) -> dict[str, Any]:
    """The setup metadata of a worker that keeps running."""
    return {
        "node_id": info.node_id,
        "node_ip": info.node_ip,
        "pid": info.pid,
        "gpu_ids": info.gpu_ids,
    }
