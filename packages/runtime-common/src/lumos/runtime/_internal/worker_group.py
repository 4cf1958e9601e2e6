"""WorkerGroup: a gang of worker actors in one placement group, with ranks."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lumos.runtime._internal.actor import ACTOR_MAX_CONCURRENCY, WorkerActor
from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.errors import RemoteError, WorkerGroupError, WorkerGroupStartError
from lumos.runtime._internal.events import Event
from lumos.runtime._internal.multiplexer import EventMultiplexer, describe_actor_error
from lumos.runtime._internal.pg_owner import creator_actor_id, placement_group_name
from lumos.runtime._internal.placement import actor_options, assign_ranks
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.session import WorkerInfo

logger = logging.getLogger("lumos.runtime")

T = TypeVar("T")
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_WAITING_FIRST_S = 3.0
_WAITING_EVERY_S = 15.0
# After a standby took over a rank, the next one starts this much later (so that its
# start-up does not compete for CPU with the restarted training).
_STANDBY_RESPAWN_DELAY_S = 5.0
# How long replace_workers waits for a standby that is still warming up.
_STANDBY_WAIT_S = 60.0

RemoteWorker: Any = ray.remote(WorkerActor)


@dataclass(frozen=True)
class WorkerGroupSpec:
    """What to start: how many workers, what each needs, where and how.

    Args:
        num_workers: Number of workers (world size), >= 1.
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 1, "GPU": 1}``.
        placement_strategy: Placement group strategy.
        env_vars: Environment variables set in each worker before user code runs.
        placement_timeout_s: Give up starting after this many seconds (``None``: wait).
        health_check_timeout_s: A worker not answering within this many seconds (beyond
            its long-poll wait) is reported as ``WorkerHungEvent``.
        standby: Keep one extra, idle worker process ready (started with the group, its
            ``warm_imports`` imported, the launched function preloaded) that
            ``replace_workers`` uses instead of starting a new actor: a failed rank is
            back in well under a second. It reserves no Ray resources (it runs only in
            place of a dead worker, whose bundle it uses) and is used only for a rank on
            its node; with GPUs or custom resources per worker it is not started.
        warm_imports: Modules the standby imports while it waits (e.g. ``("torch",)``).

    Raises:
        ValueError: A field is out of range; the message names the field and value.

    Example:
        >>> spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 1, "GPU": 1},
        ...                        placement_strategy="SPREAD", env_vars={"NCCL_DEBUG": "WARN"})
        >>> spec.health_check_timeout_s
        10.0
    """

    num_workers: int
    resources_per_worker: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    placement_strategy: PlacementStrategy = "PACK"
    env_vars: dict[str, str] = field(default_factory=dict)
    placement_timeout_s: float | None = None
    health_check_timeout_s: float = 10.0
    standby: bool = False
    warm_imports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_workers, bool)
            or not isinstance(self.num_workers, int)
            or self.num_workers < 1
        ):
            raise ValueError(f"num_workers={self.num_workers!r} is invalid: must be an int >= 1")
        validate_resources(self.resources_per_worker)
        if self.placement_strategy not in _STRATEGIES:
            raise ValueError(
                f"placement_strategy={self.placement_strategy!r} is invalid: allowed are {', '.join(_STRATEGIES)}"
            )
        validate_env_vars(self.env_vars)
        if self.placement_timeout_s is not None and not self.placement_timeout_s > 0:
            raise ValueError(
                f"placement_timeout_s={self.placement_timeout_s!r} is invalid: must be > 0 or None (wait)"
            )
        if not self.health_check_timeout_s > 0:
            raise ValueError(
                f"health_check_timeout_s={self.health_check_timeout_s!r} is invalid: must be > 0"
            )
        if not isinstance(self.warm_imports, tuple) or not all(
            isinstance(m, str) and m for m in self.warm_imports
        ):
            raise ValueError(
                f"warm_imports={self.warm_imports!r} is invalid: must be a tuple of module names"
            )

    @property
    def uses_standby(self) -> bool:
        """True when ``standby`` is set and workers need only CPUs (and memory)."""
        return self.standby and set(self.resources_per_worker) <= {"CPU", "memory"}


def validate_resources(
    resources: dict[str, float], name: str = "resources_per_worker", allow_zero: bool = False
) -> None:
    """Check a Ray resource dict; the message names the field, the value and the rule."""
    if not isinstance(resources, dict) or (not resources and not allow_zero):
        raise ValueError(
            f"{name}={resources!r} is invalid: must be a non-empty dict like {{'CPU': 1}}"
        )
    for k, v in resources.items():
        if (
            not isinstance(k, str)
            or isinstance(v, bool)
            or not isinstance(v, (int, float))
            or v < 0
        ):
            raise ValueError(f"{name}[{k!r}]={v!r} is invalid: amounts must be numbers >= 0")
    if not allow_zero and not any(v > 0 for v in resources.values()):
        raise ValueError(
            f"{name}={resources!r} is invalid: at least one amount must be > 0 "
            "(a placement group bundle cannot be empty)"
        )


def validate_env_vars(env_vars: dict[str, str], name: str = "env_vars") -> None:
    if not isinstance(env_vars, dict):
        raise ValueError(f"{name}={env_vars!r} is invalid: must be a dict of str to str")
    for k, v in env_vars.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"{name}[{k!r}]={v!r} is invalid: keys and values must be str")


def new_worker_actor(
    opts: dict[str, Any], pg: PlacementGroup | None = None, bundle_index: int = 0
) -> Any:
    """A worker actor: threaded, never restarted by Ray, with ``opts`` (its resources,
    see ``actor_options``); in bundle ``bundle_index`` of ``pg`` when given."""
    if pg is not None:
        opts = {
            **opts,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle_index
            ),
        }
    return RemoteWorker.options(
        max_concurrency=ACTOR_MAX_CONCURRENCY, max_restarts=0, max_task_retries=0, **opts
    ).remote()


def kill_quietly(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        logger.debug("ray.kill failed (actor already gone)", exc_info=True)


def remote_error_from_ray(exc: BaseException, rank: int) -> RemoteError:
    """RemoteError for a failed actor call (user exception or dead actor)."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        name = (
            f"{type(cause).__module__}.{type(cause).__qualname__}"
            if cause
            else "ray.exceptions.RayTaskError"
        )
        return RemoteError(
            name, str(cause) if cause else str(exc), str(exc), cause=cause, rank=rank
        )
    return RemoteError.from_exception(exc, rank=rank)


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
        pg: PlacementGroup,
        actors: list[Any],
        bundles: list[int],
        infos: list[WorkerInfo],
    ) -> None:
        self.spec = spec
        self._pg: PlacementGroup | None = pg
        self._actors = actors
        self._bundles = bundles
        self.workers: list[WorkerInfo] = infos
        self._msg_seq = [0] * len(actors)
        self._seq_lock = threading.Lock()
        self._relay = CollectiveRelay(len(actors), self._send_control)
        self._mux = EventMultiplexer(spec.health_check_timeout_s, self._relay.handle)
        for rank, actor in enumerate(actors):
            self._mux.add(rank, actor, infos[rank].node_id)
        self._closed = False
        self._fn_counter = 0
        self._standby: _Standby | None = None
        self._standby_due: float | None = None  # when to start the next standby

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
        if not ray.is_initialized():
            ray.init()
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
                actors.append(new_worker_actor(opts, pg, i))
            env = dict(spec.env_vars) or None
            refs = [a.setup.remote(env) for a in actors]
            metas = _wait_setup(refs, spec, pg, on_waiting)
            owner_node = ray.get_runtime_context().get_node_id()
            order, infos = assign_ranks(metas, owner_node)
        except BaseException:
            for a in actors:
                kill_quietly(a)
            _remove_pg(pg)
            raise
        group = cls(spec, pg, [actors[i] for i in order], list(order), infos)
        group._spawn_standby()
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
            raise ValueError(
                f"per_rank_kwargs has {len(per_rank_kwargs)} entries: need one per worker ({len(self._actors)})"
            )
        self._relay.reset()
        self._fn_counter += 1
        fn_key = f"{id(self)}:{self._fn_counter}"
        fn_ref = ray.put(fn)
        args_ref = ray.put((tuple(args), dict(kwargs or {})))
        if self._standby is not None:
            self._standby.actor.preload.remote(fn_key, [fn_ref], [args_ref])
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
        """
        self._check_open()
        if self._standby_due is not None and time.monotonic() >= self._standby_due:
            self._spawn_standby()
        return self._mux.poll(timeout_s)

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
        assert self._pg is not None
        ranks = sorted(set(ranks))
        for rank in ranks:
            self._kill_rank(rank)
            self._mux.remove(rank)
        new: dict[int, Any] = {}
        standby_meta: dict[int, dict[str, Any]] = {}
        taken = self._take_standby([self.workers[r].node_id for r in ranks])
        if taken is not None:
            index, actor, meta = taken
            new[ranks[index]] = actor
            standby_meta[ranks[index]] = meta
            logger.info("rank %d: the standby worker (pid %s) took over", ranks[index], meta["pid"])
            self._standby_due = time.monotonic() + _STANDBY_RESPAWN_DELAY_S
        fresh = [r for r in ranks if r not in standby_meta]
        opts = actor_options(self.spec.resources_per_worker)
        for rank in fresh:
            new[rank] = new_worker_actor(opts, self._pg, self._bundles[rank])
        env = dict(self.spec.env_vars) or None
        refs = [new[r].setup.remote(env) for r in fresh]
        try:
            metas_new = _wait_setup(refs, self.spec, self._pg)
        except BaseException:
            for a in new.values():
                kill_quietly(a)
            raise
        metas: list[dict[str, Any]] = []
        by_rank = dict(zip(fresh, metas_new, strict=True)) | standby_meta
        for rank, info in enumerate(self.workers):
            if rank in by_rank:
                metas.append(by_rank[rank])
            else:
                metas.append(
                    {
                        "node_id": info.node_id,
                        "node_ip": info.node_ip,
                        "pid": info.pid,
                        "gpu_ids": info.gpu_ids,
                    }
                )
        for rank in ranks:
            self._actors[rank] = new[rank]
            self._msg_seq[rank] = 0
            self._mux.add(rank, new[rank], by_rank[rank]["node_id"])
        self.workers = _infos_keep_ranks(metas)
        self._relay.reset()
        return sorted(standby_meta)

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
            if self._standby is not None:
                kill_quietly(self._standby.actor)
                self._standby = None
            self._mux.clear()
            if self._pg is not None:
                _remove_pg(self._pg)
                self._pg = None

    # -- standby ----------------------------------------------------------------------
    def _spawn_standby(self) -> None:
        """Start the standby worker (no resources, in rank 0's bundle); see ``standby``."""
        self._standby_due = None
        if not self.spec.uses_standby or self._pg is None or self._closed:
            return
        actor = new_worker_actor({"num_cpus": 0}, self._pg, self._bundles[0])
        env = dict(self.spec.env_vars)
        # Ray sets OMP_NUM_THREADS from an actor's CPUs; the standby reserves none.
        cpus = float(self.spec.resources_per_worker.get("CPU", 1.0))
        env.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))
        ready = actor.setup.remote(env, list(self.spec.warm_imports))
        self._standby = _Standby(actor, ready)

    def _take_standby(self, nodes: list[str | None]) -> tuple[int, Any, dict[str, Any]] | None:
        """Hand the standby over for the first of ``nodes`` on its node.

        Returns ``(index into nodes, actor, setup meta)``, or None (no standby, it
        failed, or it is on another node: it is then killed and a new one started).
        """
        sb, self._standby = self._standby, None
        if sb is None:
            return None
        try:
            meta: dict[str, Any] = ray.get(sb.ready, timeout=_STANDBY_WAIT_S)
            ray.get(sb.actor.ping.remote(), timeout=_STANDBY_WAIT_S)  # still alive
        except Exception as exc:
            logger.info("the standby worker is not usable (%s); starting a new worker", exc)
        else:
            for index, node in enumerate(nodes):
                if node == meta["node_id"]:
                    return index, sb.actor, meta
        kill_quietly(sb.actor)
        self._standby_due = time.monotonic()
        return None

    # -- helpers ----------------------------------------------------------------------
    @property
    def placement_group(self) -> PlacementGroup | None:
        """The Ray placement group (``None`` after shutdown)."""
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


@dataclass
class _Standby:
    actor: Any
    ready: Any  # ObjectRef of its setup call (returns its meta once warm)


def _infos_keep_ranks(metas: list[dict[str, Any]]) -> list[WorkerInfo]:
    _, infos = assign_ranks(metas, None)
    # assign_ranks may reorder; keep world ranks fixed and recompute the rest.
    by_pid = {(i.node_id, i.pid): i for i in infos}
    out: list[WorkerInfo] = []
    for rank, m in enumerate(metas):
        i = by_pid[(m["node_id"], int(m["pid"]))]
        out.append(
            WorkerInfo(
                world_rank=rank,
                world_size=len(metas),
                local_rank=i.local_rank,
                local_world_size=i.local_world_size,
                node_rank=i.node_rank,
                node_id=i.node_id,
                node_ip=i.node_ip,
                pid=i.pid,
                gpu_ids=list(i.gpu_ids),
            )
        )
    return out


def _remove_pg(pg: PlacementGroup) -> None:
    try:
        remove_placement_group(pg)
    except Exception:
        logger.debug("remove_placement_group failed", exc_info=True)


def _wait_setup(
    refs: list[Any],
    spec: WorkerGroupSpec,
    pg: PlacementGroup | None,
    on_waiting: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Wait for every actor's setup call; bounded by ``spec.placement_timeout_s``.

    Reports "waiting for resources" after ``_WAITING_FIRST_S``, then every
    ``_WAITING_EVERY_S``, to the log and to ``on_waiting``.
    """
    start = time.monotonic()
    pending = list(refs)
    next_wait = _WAITING_FIRST_S
    while pending:
        elapsed = time.monotonic() - start
        wait_s = next_wait
        if spec.placement_timeout_s is not None:
            wait_s = min(wait_s, spec.placement_timeout_s - elapsed)
        if wait_s <= 0:
            needed = spec.resources_per_worker
            raise WorkerGroupStartError(
                f"could not start {spec.num_workers} worker(s) with {needed} each "
                f"(placement_strategy={spec.placement_strategy!r}) within placement_timeout_s="
                f"{spec.placement_timeout_s}; cluster resources available now: {_available()}"
            )
        _ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        if pending and (
            spec.placement_timeout_s is None or time.monotonic() - start < spec.placement_timeout_s
        ):
            next_wait = _WAITING_EVERY_S
            message = waiting_message(spec, len(refs) - len(pending), len(refs), _available())
            logger.info("%s", message)
            if on_waiting is not None:
                try:
                    on_waiting(message)
                except Exception:
                    logger.warning("on_waiting callback failed", exc_info=True)
    metas: list[dict[str, Any]] = []
    for ref in refs:
        try:
            metas.append(ray.get(ref))
        except (RayActorError, RayTaskError) as exc:
            raise WorkerGroupStartError(
                f"a worker failed to start: {describe_actor_error(exc)}"
            ) from exc
    return metas


def waiting_message(
    spec: WorkerGroupSpec, started: int, total: int, available: dict[str, float]
) -> str:
    """The "waiting for resources" line: what is requested and what is free."""
    free = ", ".join(f"{k}={v:g}" for k, v in sorted(available.items())) or "unknown"
    return (
        f"waiting for resources: {started} of {total} worker(s) started; requested "
        f"{spec.num_workers} worker(s) x {dict(spec.resources_per_worker)} "
        f"(placement_strategy={spec.placement_strategy!r}); free in the cluster now: {free}"
    )


def _available() -> dict[str, float]:
    try:
        return {
            k: v
            for k, v in ray.available_resources().items()  # type: ignore[no-untyped-call]
            if not k.startswith("node:")
        }
    except Exception:
        return {}
