"""Test helpers: in-process fakes of WorkerGroup / WorkerPool, and Ray hygiene checks.

``FakeWorkerGroup`` and ``FakeWorkerPool`` implement the same interface as the real
classes without Ray: user functions run in threads of this process with a real
``WorkerSession`` (emit, receive, barrier, broadcast, stop all work), and failures
can be scripted (a worker dies, hangs or raises; a start fails). ``FakeCluster``
hands out scripted groups from ``start(spec)`` so a controller that takes a
``start`` callable can be unit tested.

Example:
    >>> from lumos.runtime import WorkerGroupSpec, WorkerDiedEvent
    >>> from lumos.runtime.testing import FakeCluster
    >>> cluster = FakeCluster([lambda g: g.after_reports(3, lambda g: g.kill_worker(1))])
    >>> group = cluster.start(WorkerGroupSpec(num_workers=2))
    >>> # ... drive group.launch / group.poll as the real controller would
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, Union

from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.errors import (
    LumosRuntimeError,
    RemoteError,
    WorkerGroupError,
)
from lumos.runtime._internal.events import (
    ErrorEvent,
    Event,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
)
from lumos.runtime._internal.multiplexer import decode
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.session import (
    RawEvent,
    WorkerInfo,
    WorkerSession,
    run_user_fn,
    set_thread_session,
)
from lumos.runtime._internal.worker_group import WorkerGroupSpec

__all__ = [
    "FakeCluster",
    "FakeWorkerGroup",
    "FakeWorkerPool",
    "StartAction",
    "alive_actors",
    "alive_placement_groups",
    "assert_no_leaked_actors",
]

T = TypeVar("T")


class _SharedQueue:
    """One queue of ``(key, raw_event)`` for all fake workers, with a wake-up."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: collections.deque[tuple[int, RawEvent | Event]] = collections.deque()

    def put(self, key: int, item: RawEvent | Event) -> None:
        with self.cond:
            self.items.append((key, item))
            self.cond.notify_all()


class _RankOutbox:
    def __init__(self, shared: _SharedQueue, key: int) -> None:
        self._shared = shared
        self._key = key

    def put(self, item: RawEvent) -> None:
        self._shared.put(self._key, item)


def _thread_main(
    session: WorkerSession,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outbox: _RankOutbox,
    key: int,
) -> None:
    set_thread_session(session)
    try:
        run_user_fn(
            session, fn, args, kwargs, outbox, lambda exc: RemoteError.from_exception(exc, rank=key)
        )
    finally:
        set_thread_session(None)


class _FakeWorkers(ShutsDownOnExit):
    """Threads + sessions + a shared event queue; the base of both fakes."""

    def __init__(self) -> None:
        self._queue = _SharedQueue()
        self._sessions: dict[int, WorkerSession] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._dead: set[int] = set()
        self._actions: list[tuple[int, Callable[[Any], None]]] = []
        self.reports_seen = 0
        self.launches: list[dict[str, Any]] = []
        self.sent: list[tuple[Any, list[int]]] = []
        self.closed = False
        self.leaked_threads: list[int] = []

    # -- scripting --------------------------------------------------------------------
    def inject(self, event: Event) -> None:
        """Make ``event`` appear in the next ``poll`` (after what is already queued)."""
        self._queue.put(event.rank, event)

    def kill_worker(self, key: int, reason: str = "killed by the test") -> None:
        """Simulate a dead actor: WorkerDiedEvent, later events of it dropped, thread stopped."""
        self._fail(key, WorkerDiedEvent(key, self._node_of(key), reason))

    def hang_worker(self, key: int, waited_s: float = 10.0) -> None:
        """Simulate a hung worker: WorkerHungEvent, later events of it dropped."""
        self._fail(key, WorkerHungEvent(key, self._node_of(key), waited_s))

    def fail_worker(self, key: int, exc: BaseException) -> None:
        """Inject an ErrorEvent for ``key`` as if its user function raised ``exc``."""
        try:
            raise exc
        except BaseException as caught:
            self.inject(ErrorEvent(key, RemoteError.from_exception(caught, rank=key)))

    def after_reports(self, n: int, action: Callable[[Any], None]) -> None:
        """Run ``action(self)`` inside ``poll`` once ``n`` reports have been returned."""
        self._actions.append((n, action))

    def _fail(self, key: int, event: Event) -> None:
        self._dead.add(key)
        session = self._sessions.get(key)
        if session is not None:
            session._request_stop()
        self._queue.put(key, event)

    def _node_of(self, key: int) -> str | None:
        return "fake-node-0"

    # -- running ----------------------------------------------------------------------
    def _start_thread(
        self,
        key: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        info: WorkerInfo | None,
        session_info: dict[str, Any] | None,
    ) -> None:
        old = self._threads.get(key)
        if old is not None and old.is_alive():
            # Same as the real actor: the launch fails as an ErrorEvent of that worker.
            self.fail_worker(
                key, RuntimeError("launch() on a worker whose previous function is still running")
            )
            return
        outbox = _RankOutbox(self._queue, key)
        session = WorkerSession(info, session_info, outbox)
        self._sessions[key] = session
        t = threading.Thread(
            target=_thread_main,
            args=(session, fn, args, kwargs, outbox, key),
            name=f"lumos-fake-worker-{key}",
            daemon=True,
        )
        self._threads[key] = t
        t.start()

    def _poll(self, timeout_s: float | None, relay: CollectiveRelay | None) -> list[Event]:
        if self.closed:
            raise LumosRuntimeError("poll() after shutdown")
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._queue.cond:
                while not self._queue.items:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return []
                    if remaining is None and not any(t.is_alive() for t in self._threads.values()):
                        return []  # nothing can ever arrive
                    self._queue.cond.wait(remaining if remaining is not None else 1.0)
                items = list(self._queue.items)
                self._queue.items.clear()
            events: list[Event] = []
            for key, item in items:
                if isinstance(item, tuple):
                    if key in self._dead:
                        continue
                    ev = decode(key, item, relay.handle if relay is not None else None)
                    if ev is None:
                        continue
                else:
                    ev = item
                events.append(ev)
                if isinstance(ev, ReportEvent):
                    self.reports_seen += 1
                    self._run_actions()
            if events:
                return events

    def _run_actions(self) -> None:
        due = [a for a in self._actions if a[0] <= self.reports_seen]
        if due:
            self._actions = [a for a in self._actions if a[0] > self.reports_seen]
            for _, action in due:
                action(self)

    def _stop_all(self, keys: Iterable[int], grace_period_s: float) -> None:
        for k in keys:
            s = self._sessions.get(k)
            if s is not None:
                s._request_stop()
        deadline = time.monotonic() + grace_period_s
        for k in keys:
            t = self._threads.get(k)
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    self.leaked_threads.append(k)


class FakeWorkerGroup(_FakeWorkers):
    """In-process stand-in for ``WorkerGroup`` (same methods, no Ray).

    Args:
        spec: The group spec (``num_workers`` is used; resources are ignored).
        num_nodes: Spread the fake workers over this many fake nodes (contiguous ranks).

    Attributes:
        launches: One dict per ``launch`` call (fn, args, kwargs, per_rank_kwargs, session_info).
        sent: ``(value, ranks)`` per ``send`` call.
        replaced: Ranks passed to ``replace_workers``, per call.
        shutdown_calls: How often ``shutdown`` was called.
    """

    def __init__(self, spec: WorkerGroupSpec, num_nodes: int = 1) -> None:
        super().__init__()
        self.spec = spec
        n = spec.num_workers
        per_node = -(-n // max(1, num_nodes))
        self.workers: list[WorkerInfo] = []
        for rank in range(n):
            node = rank // per_node
            on_node = min(per_node, n - node * per_node)
            self.workers.append(
                WorkerInfo(
                    world_rank=rank,
                    world_size=n,
                    local_rank=rank - node * per_node,
                    local_world_size=on_node,
                    node_rank=node,
                    node_id=f"fake-node-{node}",
                    node_ip="127.0.0.1",
                    pid=os.getpid(),
                    gpu_ids=[],
                )
            )
        self._relay = CollectiveRelay(n, self._send_control)
        self.replaced: list[list[int]] = []
        self.shutdown_calls = 0

    @classmethod
    def start(
        cls, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
    ) -> FakeWorkerGroup:
        """Same signature as ``WorkerGroup.start`` (never waits: ``on_waiting`` unused)."""
        return cls(spec)

    def _node_of(self, key: int) -> str | None:
        return self.workers[key].node_id if 0 <= key < len(self.workers) else None

    def launch(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        per_rank_kwargs: list[dict[str, Any]] | None = None,
        session_info: dict[str, Any] | None = None,
    ) -> None:
        """Start ``fn`` in one thread per rank (as ``WorkerGroup.launch``)."""
        self._check_open()
        if per_rank_kwargs is not None and len(per_rank_kwargs) != len(self.workers):
            raise ValueError(
                f"per_rank_kwargs has {len(per_rank_kwargs)} entries: need one per worker ({len(self.workers)})"
            )
        self.launches.append(
            {
                "fn": fn,
                "args": args,
                "kwargs": kwargs,
                "per_rank_kwargs": per_rank_kwargs,
                "session_info": session_info,
            }
        )
        self._relay.reset()
        for rank, info in enumerate(self.workers):
            if rank in self._dead:
                continue
            kw = {**(kwargs or {}), **(per_rank_kwargs[rank] if per_rank_kwargs else {})}
            self._start_thread(rank, fn, tuple(args), kw, info, session_info)

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Events of all fake workers (as ``WorkerGroup.poll``)."""
        return self._poll(timeout_s, self._relay)

    def send(self, value: Any, ranks: list[int] | None = None) -> None:
        """Deliver ``value`` to the sessions of ``ranks`` (all by default)."""
        self._check_open()
        targets = list(range(len(self.workers))) if ranks is None else list(ranks)
        self.sent.append((value, targets))
        for r in targets:
            s = self._sessions.get(r)
            if s is not None:
                s._deliver(value)

    def request_stop(self) -> None:
        """Set every session's stop flag."""
        for s in self._sessions.values():
            s._request_stop()

    def execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> list[T]:
        """Run ``fn`` once per rank in this thread; WorkerGroupError on failures."""
        self._check_open()
        results: list[Any] = []
        errors: dict[int, RemoteError] = {}
        for rank in range(len(self.workers)):
            if rank in self._dead:
                errors[rank] = RemoteError(
                    "ray.exceptions.ActorDiedError", "worker is dead", "", rank=rank
                )
                results.append(None)
                continue
            try:
                results.append(fn(*args, **kwargs))
            except Exception as exc:
                errors[rank] = RemoteError.from_exception(exc, rank=rank)
                results.append(None)
        if errors:
            raise WorkerGroupError(errors)
        return results

    def execute_single(self, rank: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` once for ``rank`` in this thread."""
        self._check_open()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise WorkerGroupError({rank: RemoteError.from_exception(exc, rank=rank)}) from exc

    def replace_workers(self, ranks: list[int]) -> list[int]:
        """Revive ``ranks`` (their old threads are asked to stop); no standby here."""
        self._check_open()
        self.replaced.append(list(ranks))
        self._stop_all(ranks, 1.0)
        for r in ranks:
            self._dead.discard(r)
            self._sessions.pop(r, None)
        return []

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop all threads (bounded by ``grace_period_s``); idempotent."""
        self.shutdown_calls += 1
        if self.closed:
            return
        self.closed = True
        self._stop_all(list(self._threads), grace_period_s)

    def _send_control(self, ranks: list[int], key: tuple[str, int], value: Any) -> None:
        for r in ranks:
            s = self._sessions.get(r)
            if s is not None and r not in self._dead:
                s._deliver_control(key, value)

    def _check_open(self) -> None:
        if self.closed:
            raise WorkerGroupError({}, "the worker group was shut down")


StartAction = Union[None, BaseException, Callable[[FakeWorkerGroup], None]]  # noqa: UP007
"""One scripted outcome of ``FakeCluster.start``: ``None`` (plain start), an exception
to raise (e.g. ``WorkerGroupStartError``), or a callable that scripts the new group."""


class FakeCluster:
    """Hands out ``FakeWorkerGroup``s from ``start(spec)``, one scripted action per start.

    Args:
        script: Actions for the 1st, 2nd, ... start; starts past the script are plain.
        num_nodes: Fake nodes per group.
        waiting_messages: Lines each ``start`` passes to its ``on_waiting`` callback
            before it returns or raises (simulates "waiting for resources").

    Attributes:
        groups: Every group started, in order.
        specs: The spec of every ``start`` call (also failed ones).

    Example:
        >>> cluster = FakeCluster([WorkerGroupStartError("no resources"), None])
        >>> # controller(start=cluster.start): 1st start raises, 2nd works
    """

    def __init__(
        self,
        script: Iterable[StartAction] = (),
        num_nodes: int = 1,
        waiting_messages: Iterable[str] = (),
    ) -> None:
        self._script: collections.deque[StartAction] = collections.deque(script)
        self.num_nodes = num_nodes
        self.waiting_messages = list(waiting_messages)
        self.groups: list[FakeWorkerGroup] = []
        self.specs: list[WorkerGroupSpec] = []

    def start(
        self, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
    ) -> FakeWorkerGroup:
        """Same signature as ``WorkerGroup.start``."""
        self.specs.append(spec)
        if on_waiting is not None:
            for message in self.waiting_messages:
                on_waiting(message)
        action = self._script.popleft() if self._script else None
        if isinstance(action, BaseException):
            raise action
        group = FakeWorkerGroup(spec, num_nodes=self.num_nodes)
        if action is not None:
            action(group)
        self.groups.append(group)
        return group


class FakeWorkerPool(_FakeWorkers):
    """In-process stand-in for ``WorkerPool`` (same methods, no Ray).

    Args:
        resources_per_worker: Recorded, not used.
        env_vars: Recorded, not used.
        health_check_timeout_s: Recorded, not used.
        capacity: At most this many workers are "ready" at once; the rest stay pending
            until workers are removed (``None``: unlimited).
    """

    def __init__(
        self,
        resources_per_worker: dict[str, float] | None = None,
        env_vars: dict[str, str] | None = None,
        health_check_timeout_s: float = 10.0,
        capacity: int | None = None,
    ) -> None:
        super().__init__()
        self.resources_per_worker = dict(resources_per_worker or {"CPU": 1.0})
        self.env_vars = dict(env_vars or {})
        self.health_check_timeout_s = health_check_timeout_s
        self.capacity = capacity
        self._ids: list[int] = []
        self._next_id = 0
        self.removed: list[int] = []

    @property
    def worker_ids(self) -> list[int]:
        """Ids of all workers (pending included)."""
        return list(self._ids)

    def add_worker(self) -> int:
        """Add a fake worker; returns its id."""
        self._check_open()
        wid = self._next_id
        self._next_id += 1
        self._ids.append(wid)
        return wid

    def ready(self, worker_id: int) -> bool:
        """True when the worker is within ``capacity``."""
        return worker_id in self._ids and worker_id not in self.pending_workers()

    def pending_workers(self) -> list[int]:
        """Workers beyond ``capacity``."""
        if self.capacity is None:
            return []
        return self._ids[self.capacity :]

    def launch(
        self,
        worker_id: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        session_info: dict[str, Any] | None = None,
    ) -> None:
        """Start ``fn`` in a thread for that worker."""
        self._check_open()
        if worker_id not in self._ids:
            raise LumosRuntimeError(f"unknown worker id {worker_id} (removed or never added)")
        self.launches.append(
            {
                "worker_id": worker_id,
                "fn": fn,
                "args": args,
                "kwargs": kwargs,
                "session_info": session_info,
            }
        )
        self._start_thread(worker_id, fn, tuple(args), dict(kwargs or {}), None, session_info)

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Events of all fake workers (``rank`` is the worker id)."""
        return self._poll(timeout_s, None)

    def send(self, worker_id: int, value: Any) -> None:
        """Deliver ``value`` to that worker's session."""
        self.sent.append((value, [worker_id]))
        s = self._sessions.get(worker_id)
        if s is not None:
            s._deliver(value)

    def request_stop(self, worker_id: int) -> None:
        """Set that worker's stop flag."""
        s = self._sessions.get(worker_id)
        if s is not None:
            s._request_stop()

    def remove_worker(self, worker_id: int) -> None:
        """Forget the worker (its thread is asked to stop)."""
        if worker_id in self._ids:
            self._ids.remove(worker_id)
            self.removed.append(worker_id)
            s = self._sessions.get(worker_id)
            if s is not None:
                s._request_stop()
            self._dead.add(worker_id)

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop all threads (bounded by ``grace_period_s``); idempotent."""
        if self.closed:
            return
        self.closed = True
        self._stop_all(list(self._threads), grace_period_s)

    def _check_open(self) -> None:
        if self.closed:
            raise LumosRuntimeError("the worker pool was shut down")


# -- helpers for tests on a real Ray cluster --------------------------------------------
_api_server_urls: dict[str, str] = {}


@contextlib.contextmanager
def _state_api_of_connected_cluster() -> Iterator[None]:
    """Point Ray's state API at the cluster this process is connected to.

    The state API otherwise follows ``RAY_ADDRESS`` (e.g. ``local``) or guesses, which
    fails or picks another cluster when several local Ray instances run on the machine.
    ``RAY_API_SERVER_ADDRESS`` takes precedence over both, so it is set for the call.
    """
    import ray
    from ray.dashboard.utils import ray_address_to_api_server_url

    gcs = str(ray.get_runtime_context().gcs_address)
    url = _api_server_urls.get(gcs)
    if url is None:
        url = _api_server_urls[gcs] = str(ray_address_to_api_server_url(gcs))
    old = os.environ.get("RAY_API_SERVER_ADDRESS")
    os.environ["RAY_API_SERVER_ADDRESS"] = url
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = old


def alive_actors() -> list[Any]:
    """Actors of the connected cluster that are not DEAD (Ray state API; needs the dashboard)."""
    from ray.util.state import list_actors

    with _state_api_of_connected_cluster():
        actors = list_actors(limit=10_000, raise_on_missing_output=False)
    return [a for a in actors if a.state != "DEAD"]


def alive_placement_groups() -> list[Any]:
    """Placement groups of the connected cluster that are not REMOVED (Ray state API)."""
    from ray.util.state import list_placement_groups

    with _state_api_of_connected_cluster():
        pgs = list_placement_groups(limit=10_000, raise_on_missing_output=False)
    return [p for p in pgs if p.state != "REMOVED"]


def assert_no_leaked_actors(timeout_s: float = 30.0, ignore_names: Iterable[str] = ()) -> None:
    """Assert every actor is DEAD and every placement group REMOVED.

    Killing is asynchronous, so this re-checks (bounded by ``timeout_s``) before failing.
    Needs Ray started with the dashboard (``ray.init(include_dashboard=True)``), which
    serves the state API.

    Args:
        timeout_s: How long to wait for late deaths.
        ignore_names: Actor names (``name=``) that may stay alive (e.g. test fixtures).
    """
    ignored = set(ignore_names)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        actors = [a for a in alive_actors() if (a.name or "") not in ignored]
        pgs = alive_placement_groups()
        if not actors and not pgs:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(
                "leaked Ray resources: actors "
                + repr([(a.class_name, a.state, a.pid) for a in actors])
                + ", placement groups "
                + repr([(p.placement_group_id, p.state) for p in pgs])
            )
        time.sleep(delay)  # no event to wait on: the state API is poll-only
        delay = min(delay * 2, 1.0)
