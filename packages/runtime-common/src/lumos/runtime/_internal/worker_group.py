"""WorkerGroup: a gang of worker actors in one placement group, with ranks.

The actors come from ``actor_factory``, the wait for their placement from
``placement_wait`` and the spare worker from ``standby``. The group's state and its
primitives are ``group_core.GroupCore``; the elastic start and resizing in place
(``add_workers``, ``remove_workers``) are ``elastic_group.ElasticGroup``. This module
holds the fixed-size start, the runs (launch, poll, send, execute), the repair
(``replace_workers``) and the shutdown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group

from lumos.runtime._internal import messages
from lumos.runtime._internal.actor_factory import (
    kill_quietly,
    release_quietly,
    remote_error_from_ray,
    remove_placement_group_quietly,
)
from lumos.runtime._internal.elastic_group import ElasticGroup
from lumos.runtime._internal.errors import (
    RemoteError,
    RuntimeConfigError,
    RuntimeUsageError,
    WorkerGroupError,
)
from lumos.runtime._internal.events import Event, WorkerPreemptedEvent
from lumos.runtime._internal.pg_owner import (
    creator_actor_id,
    placement_group_name,
    remove_groups_of_dead_jobs,
)
from lumos.runtime._internal.placement import (
    assign_ranks,
    avoid_nodes_selector,
    infos_keep_ranks,
    meta_of,
)
from lumos.runtime._internal.placement_wait import start_workers
from lumos.runtime._internal.preemption import PreemptionInfo
from lumos.runtime._internal.ray_init import ensure_ray
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")

T = TypeVar("T")


class WorkerGroup(ElasticGroup):
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
                workers are still not placed after ~3 s, then every ~15 s while still
                waiting; workers that are placed but whose processes have not started
                after ~30 s get a "workers starting slowly: ..." line instead. The same
                line is logged on the ``lumos.runtime`` logger (INFO). Exceptions it
                raises are logged and ignored.

        Raises:
            WorkerGroupStartError: Placement timed out or an actor failed to start;
                everything created is released first.
        """
        ensure_ray()
        remove_groups_of_dead_jobs()
        if spec.elastic:
            return cls._start_elastic(spec, on_waiting)
        bundles = [dict(spec.resources_per_worker) for _ in range(spec.num_workers)]
        nodes = ray.nodes() if spec.avoid_nodes else []  # type: ignore[no-untyped-call]
        alive = [n["NodeID"] for n in nodes if n.get("Alive")]
        pg = placement_group(
            bundles,
            strategy=spec.placement_strategy,
            name=placement_group_name(creator_actor_id()),
            bundle_label_selector=avoid_nodes_selector(spec.avoid_nodes, len(bundles), alive),
        )
        actors: list[Any] = []
        try:
            slots = [(pg, i) for i in range(spec.num_workers)]
            actors, metas = start_workers(spec, slots, on_waiting=on_waiting)
            owner_node = ray.get_runtime_context().get_node_id()
            order, infos = assign_ranks(metas, owner_node)
        except BaseException:
            release_quietly(actors, [pg])
            raise
        group = cls(spec, pg, [actors[i] for i in order], list(order), infos)
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
        ranks: list[int] | None = None,
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
            ranks: Only these ranks (replacements joining a running job: the other
                ranks' functions and the barrier relay are left alone); default: all.
        """
        self._check_open()
        if per_rank_kwargs is not None and len(per_rank_kwargs) != len(self._actors):
            raise RuntimeConfigError(
                f"per_rank_kwargs has {len(per_rank_kwargs)} entries: need one per worker ({len(self._actors)})"
            )
        if ranks is None and self._vacant:
            raise RuntimeUsageError(
                f"launch() on every rank while rank(s) {sorted(self._vacant)} are vacant "
                "(vacate_workers): refill_workers() or remove_workers() them first, or pass ranks="
            )
        if ranks is None:
            self._relay.world_size = len(self._actors)  # the size may have changed (elastic)
            self._relay.reset()
        self._fn_counter += 1
        fn_key = f"{id(self)}:{self._fn_counter}"
        fn_ref = ray.put(fn)
        args_ref = ray.put((tuple(args), dict(kwargs or {})))
        self._standby.preload(fn_key, fn_ref, args_ref)
        for rank, actor in enumerate(self._actors):
            if self._mux.is_failed(rank) or (ranks is not None and rank not in ranks):
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
        metas = [by_rank.get(rank) or meta_of(info) for rank, info in enumerate(self.workers)]
        for rank in ranks:
            self._actors[rank] = new[rank]
            self._msg_seq[rank] = 0
            self._mux.add(rank, new[rank], by_rank[rank]["node_id"])
        self.workers = infos_keep_ranks(metas)
        self._relay.excuse(ranks)  # the others may be in a barrier (a full launch resets it)
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
            logger.info("%s", messages.standby_took_rank(ranks[index], meta["pid"]))
        fresh = [r for r in ranks if r not in standby_meta]
        try:
            slots = [(self._rank_pgs[r], self._bundles[r]) for r in fresh]
            actors, metas_new = start_workers(self.spec, slots)
        except BaseException:
            for a in new.values():
                kill_quietly(a)
            raise
        new.update(zip(fresh, actors, strict=True))
        by_rank = dict(zip(fresh, metas_new, strict=True)) | standby_meta
        return new, by_rank, sorted(standby_meta)

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
            own = {id(pg): pg for pg in self._rank_pgs if pg is not self._pg}
            if self._pg is not None:
                remove_placement_group_quietly(self._pg)
                self._pg = None
            for pg in own.values():  # one per rank (elastic), or a moved rank's
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
