"""WorkerPool: independent, reusable worker actors (no gang, no ranks) for Tune trials."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from lumos.runtime._internal.actor_factory import kill_quietly, new_worker_actor
from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.errors import LumosRuntimeError, RuntimeConfigError
from lumos.runtime._internal.events import Event, FinishedEvent, ReportEvent, WorkerDiedEvent
from lumos.runtime._internal.multiplexer import EventMultiplexer, describe_actor_error
from lumos.runtime._internal.pg_owner import (
    actor_id_of,
    remove_groups_of_dead_jobs,
    remove_placement_groups_of,
)
from lumos.runtime._internal.placement import actor_options
from lumos.runtime._internal.ray_init import ensure_ray
from lumos.runtime._internal.spec import validate_env_vars, validate_resources

logger = logging.getLogger("lumos.runtime")

# An idle worker is not polled for this long after its function ends, so that the next
# launch carries the poll (one round trip per short run); then it is polled again.
_PARK_IDLE_S = 0.05

# A worker killed or dead while its nested WorkerGroup called ``placement_group()`` can
# have that creation reach Ray's GCS after the pool swept its placement groups (ray.kill
# is asynchronous: the actor runs on for a moment). The pool therefore sweeps the
# placement groups of ended workers again on later polls (at most every
# _RESWEEP_EVERY_S, for _RESWEEP_FOR_S after the end) and once more at shutdown.
_RESWEEP_EVERY_S = 1.0
_RESWEEP_FOR_S = 60.0
_SHUTDOWN_DEATH_WAIT_S = 10.0


@dataclass
class _PoolWorker:
    actor: Any
    setup_ref: Any
    ready: bool = False
    node_id: str | None = None
    pid: int | None = None
    seq: int = 0
    actor_id: str | None = None
    fn_key: str | None = None  # the function this worker was last sent
    fn_loaded: bool = False  # it reported or finished running ``fn_key``: the actor caches it


class WorkerPool(ShutsDownOnExit):
    """Independent worker actors that run one function at a time each; owner side.

    Workers are placed by Ray (no placement group) and reused across launches: the
    function is ``ray.put`` once per pool and deserialized once per actor. Events
    carry the worker id as ``rank``.

    When a worker dies (``WorkerDiedEvent``) or is removed / killed / shut down, the
    placement groups of every ``WorkerGroup`` it started are removed too (Ray would
    keep them until the job ends): nested Train runs never leak reserved resources. A
    group whose creation reaches Ray only after its worker was killed or died (the
    worker was inside ``placement_group()``) is caught by later sweeps: on the next
    polls (about every second, for a minute) and at shutdown.

    Args:
        resources_per_worker: Ray resources of each worker, e.g. ``{"CPU": 1}``; all
            zero (``{"CPU": 0}``) is allowed for workers that only drive nested jobs.
        env_vars: Environment variables set in each worker before user code runs.
        health_check_timeout_s: See ``WorkerGroupSpec.health_check_timeout_s``.

    Example:
        >>> pool = WorkerPool({"CPU": 1})
        >>> wid = pool.add_worker()
        >>> pool.launch(wid, objective, kwargs={"config": {"lr": 0.1}})
        >>> events = pool.poll(timeout_s=1.0)
        >>> pool.shutdown()
    """

    def __init__(
        self,
        resources_per_worker: dict[str, float],
        env_vars: dict[str, str] | None = None,
        health_check_timeout_s: float = 10.0,
    ) -> None:
        validate_resources(resources_per_worker, allow_zero=True)
        validate_env_vars(env_vars or {})
        if not health_check_timeout_s > 0:
            raise RuntimeConfigError(
                f"health_check_timeout_s={health_check_timeout_s!r} is invalid: must be > 0"
            )
        self.resources_per_worker = dict(resources_per_worker)
        self.env_vars = dict(env_vars or {})
        self.health_check_timeout_s = health_check_timeout_s
        self._workers: dict[int, _PoolWorker] = {}
        self._next_id = 0
        self._mux = EventMultiplexer(health_check_timeout_s, park_idle_s=_PARK_IDLE_S)
        self._fn_cache: dict[int, tuple[Callable[..., Any], Any, str]] = {}
        self._backlog: list[Event] = []
        self._seq_lock = threading.Lock()
        self._closed = False
        self._ended: dict[str, float] = {}  # actor id -> when it ended (for re-sweeps)
        self._last_sweep = 0.0

    def add_worker(self, resources: dict[str, float] | None = None) -> int:
        """Create one worker actor (placement by Ray; it may wait for resources).

        Args:
            resources: This worker's Ray resources (e.g. a Tune trial's own shape);
                ``None``: the pool's ``resources_per_worker``.

        Returns:
            The worker id (used as ``rank`` in its events).

        Raises:
            RuntimeConfigError: ``resources`` is not a valid resource dict.
        """
        self._check_open()
        if resources is not None:
            validate_resources(resources, "add_worker(resources)", allow_zero=True)
        ensure_ray()
        wid = self._next_id
        self._next_id += 1
        shape = self.resources_per_worker if resources is None else resources
        actor = new_worker_actor(actor_options(shape))
        try:
            setup_ref = actor.setup.remote(self.env_vars or None)
        except BaseException:
            kill_quietly(actor)  # never recorded: nobody else would kill it
            self._sweep_ended([actor_id_of(actor)])
            raise
        self._workers[wid] = _PoolWorker(actor, setup_ref, actor_id=actor_id_of(actor))
        return wid

    def ready(self, worker_id: int) -> bool:
        """True once the worker's actor is running (its setup call returned)."""
        self._refresh()
        w = self._workers.get(worker_id)
        return w is not None and w.ready

    def pending_workers(self) -> list[int]:
        """Workers created but not yet running ("waiting for resources")."""
        self._refresh()
        return [wid for wid, w in self._workers.items() if not w.ready and w.setup_ref is not None]

    @property
    def worker_ids(self) -> list[int]:
        """Ids of all workers in the pool (pending ones included)."""
        return list(self._workers)

    def node_id(self, worker_id: int) -> str | None:
        """The Ray node id of a running worker (``None`` while pending)."""
        w = self._workers.get(worker_id)
        return w.node_id if w is not None else None

    def launch(
        self,
        worker_id: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        session_info: dict[str, Any] | None = None,
    ) -> None:
        """Start ``fn(*args, **kwargs)`` in a thread on the worker (returns at once).

        May be called on a pending worker: it starts once the actor runs.
        """
        self._check_open()
        w = self._worker(worker_id)
        cached = self._fn_cache.get(id(fn))
        if cached is None or cached[0] is not fn:
            cached = (fn, ray.put(fn), f"pool{id(self)}:{len(self._fn_cache)}:{id(fn)}")
            self._fn_cache[id(fn)] = cached
        _, fn_ref, fn_key = cached
        args_box = [(tuple(args), dict(kwargs or {}))]
        if w.fn_key == fn_key and self._mux.parked(worker_id):
            # The worker has the function and no poll outstanding: the launch call
            # returns the first events itself. Once the actor ran the function it has it
            # cached under ``fn_key``: the reference is not sent again (an ObjectRef in
            # the arguments makes every launch a borrow, the costliest part of the call).
            fn_box = [None] if w.fn_loaded else [fn_ref]
            packed = (
                self._next_seq(w),
                fn_key,
                fn_box,
                args_box,
                session_info,
                self._mux.max_wait_s,
            )
            ref = w.actor.launch_poll_packed.remote(packed)
            self._mux.adopt(worker_id, ref)
            return
        w.fn_key = fn_key
        w.fn_loaded = False
        fn_box = [fn_ref]
        self._mux.unpark(worker_id)
        w.actor.launch.remote(self._next_seq(w), fn_key, fn_box, args_box, None, None, session_info)

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Events from all workers (``event.rank`` is the worker id).

        Blocks until at least one event or ``timeout_s``; returns ``[]`` early when a
        pending worker becomes ready (so the caller can launch on it).
        """
        self._check_open()
        self._refresh()
        if self._backlog:
            out, self._backlog = self._backlog, []
            self._reap(out)
            return out
        wake = [
            w.setup_ref for w in self._workers.values() if not w.ready and w.setup_ref is not None
        ]
        events = self._mux.poll(timeout_s, wake=wake)
        self._refresh()
        if self._backlog:
            events = events + self._backlog
            self._backlog = []
        self._reap(events)
        self._note_loaded(events)
        self._resweep()
        return events

    def _note_loaded(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, (ReportEvent, FinishedEvent)):
                w = self._workers.get(e.rank)
                if w is not None:
                    w.fn_loaded = True

    def send(self, worker_id: int, value: Any) -> None:
        """Deliver ``value`` to the worker's inbox (``session.receive()``), in order."""
        self._check_open()
        w = self._worker(worker_id)
        w.actor.deliver.remote(self._next_seq(w), value)

    def request_stop(self, worker_id: int) -> None:
        """Set the stop flag of the function running on that worker."""
        self._check_open()
        w = self._worker(worker_id)
        w.actor.request_stop.remote(self._next_seq(w))

    def remove_worker(self, worker_id: int) -> None:
        """Kill the worker's actor and forget it (no-op for an unknown id)."""
        w = self._workers.pop(worker_id, None)
        self._mux.remove(worker_id)
        if w is not None:
            kill_quietly(w.actor)
            self._sweep_ended([w.actor_id])

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop every running function (up to ``grace_period_s``), then kill all actors."""
        if self._closed:
            return
        self._closed = True
        try:
            live = [
                w for wid, w in self._workers.items() if w.ready and not self._mux.is_failed(wid)
            ]
            if grace_period_s > 0 and live:
                for w in live:
                    w.actor.request_stop.remote(self._next_seq(w))
                joins = [w.actor.join.remote(grace_period_s) for w in live]
                try:
                    ray.wait(joins, num_returns=len(joins), timeout=grace_period_s + 1.0)
                except Exception:
                    logger.debug("waiting for user threads failed", exc_info=True)
        finally:
            for w in self._workers.values():
                kill_quietly(w.actor)
            ids = [w.actor_id for w in self._workers.values()]
            # An actor killed inside placement_group() may still create its group: sweep
            # once the actors are dead, including workers that ended earlier.
            _wait_until_dead([a for a in ids if a], _SHUTDOWN_DEATH_WAIT_S)
            remove_placement_groups_of([*ids, *self._ended])
            remove_groups_of_dead_jobs()  # what killed drivers' actors left (pg_owner)
            self._ended.clear()
            self._workers.clear()
            self._mux.clear()
            self._fn_cache.clear()

    # -- helpers ----------------------------------------------------------------------
    def _worker(self, worker_id: int) -> _PoolWorker:
        w = self._workers.get(worker_id)
        if w is None:
            raise LumosRuntimeError(f"unknown worker id {worker_id} (removed or never added)")
        return w

    def _next_seq(self, w: _PoolWorker) -> int:
        with self._seq_lock:
            seq = w.seq
            w.seq = seq + 1
            return seq

    def _refresh(self) -> None:
        """Register workers whose setup returned; a failed setup is a WorkerDiedEvent."""
        waiting = {
            w.setup_ref: wid
            for wid, w in self._workers.items()
            if not w.ready and w.setup_ref is not None
        }
        if not waiting:
            return
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in ready:
            wid = waiting[ref]
            w = self._workers[wid]
            w.setup_ref = None
            try:
                meta = ray.get(ref)
            except (RayActorError, RayTaskError) as exc:
                self._backlog.append(WorkerDiedEvent(wid, None, describe_actor_error(exc)))
                continue
            w.ready = True
            w.node_id = meta["node_id"]
            w.pid = meta["pid"]
            self._mux.add(wid, w.actor, w.node_id)

    def _reap(self, events: list[Event]) -> None:
        """Remove the placement groups that dead workers' WorkerGroups left behind."""
        dead = [
            self._workers[e.rank].actor_id
            for e in events
            if isinstance(e, WorkerDiedEvent) and e.rank in self._workers
        ]
        if dead:
            self._sweep_ended(dead)

    def _sweep_ended(self, actor_ids: list[str | None]) -> None:
        """Remove the ended workers' placement groups now, and remember them for re-sweeps."""
        now = time.monotonic()
        for a in actor_ids:
            if a:
                self._ended[a] = now
        self._last_sweep = now
        remove_placement_groups_of(actor_ids)

    def _resweep(self) -> None:
        """Sweep again for placement groups that ended workers created late (throttled)."""
        if not self._ended:
            return
        now = time.monotonic()
        if now - self._last_sweep < _RESWEEP_EVERY_S:
            return
        self._last_sweep = now
        remove_placement_groups_of(list(self._ended))
        self._ended = {a: t for a, t in self._ended.items() if now - t < _RESWEEP_FOR_S}

    def _check_open(self) -> None:
        if self._closed:
            raise LumosRuntimeError("the worker pool was shut down")


def _wait_until_dead(actor_ids: list[str], timeout_s: float) -> None:
    """Wait (bounded) until Ray's GCS lists every actor of ``actor_ids`` as DEAD."""
    if not actor_ids or not ray.is_initialized():
        return
    try:
        state: Any = ray._private.state.state  # the GCS accessor (as in preemption.py)
    except Exception:  # pragma: no cover - Ray internals moved
        return
    deadline = time.monotonic() + timeout_s
    pending = list(actor_ids)
    delay = 0.01
    while pending and time.monotonic() < deadline:
        still = []
        for a in pending:
            try:
                info = state.actor_table(a)
            except Exception:
                logger.debug("actor_table(%s) failed", a, exc_info=True)
                return
            if info and info.get("State") != "DEAD":
                still.append(a)
        pending = still
        if pending:
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
