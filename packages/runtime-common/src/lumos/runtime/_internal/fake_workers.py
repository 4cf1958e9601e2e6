"""The in-process fake workers both fakes are built on (threads, real sessions, one queue).

User functions run in threads of this process with a real ``WorkerSession``; the owner
side reads one shared queue. Scripted faults (a worker dies, hangs or raises) go through
the same queue, after what is already queued.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from lumos.runtime._internal.closing import ShutsDownOnExit
from lumos.runtime._internal.errors import LumosRuntimeError, RemoteError
from lumos.runtime._internal.events import (
    ErrorEvent,
    Event,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
)
from lumos.runtime._internal.multiplexer import decode
from lumos.runtime._internal.preemption import PreemptionBox
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.session import RawEvent, WorkerInfo, WorkerSession, run_user_fn


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


def _error_maker(key: int) -> Callable[[BaseException], RemoteError]:
    return lambda exc: RemoteError.from_exception(exc, rank=key)


class FakeWorkers(ShutsDownOnExit):
    """Threads + sessions + a shared event queue; the base of both fakes.

    Attributes:
        reports_seen: ReportEvents returned by ``poll`` so far (``after_reports`` counts them).
        launches: One dict per ``launch`` call.
        sent: ``(value, targets)`` per ``send`` call.
        closed: True after ``shutdown``.
        leaked_threads: Workers whose thread outlived the grace period of a stop.
    """

    def __init__(self) -> None:
        self._queue = _SharedQueue()
        self._sessions: dict[int, WorkerSession] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._dead: set[int] = set()
        self._boxes: dict[int, PreemptionBox] = {}  # per worker, as on a real actor
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
            session.request_stop()
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
        box = self._boxes.setdefault(key, PreemptionBox())
        session = WorkerSession(info, session_info, outbox, box)
        self._sessions[key] = session
        t = threading.Thread(
            # run_user_fn makes the session current in this thread (as in a real worker).
            target=run_user_fn,
            args=(session, fn, args, kwargs, outbox, _error_maker(key)),
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

    def _rekey(self, mapping: dict[int, int]) -> None:
        """Renumber the workers (old key -> new key); keys not in ``mapping`` are dropped,
        with their queued events."""
        self._sessions = {mapping[k]: v for k, v in self._sessions.items() if k in mapping}
        self._threads = {mapping[k]: v for k, v in self._threads.items() if k in mapping}
        self._boxes = {mapping[k]: v for k, v in self._boxes.items() if k in mapping}
        self._dead = {mapping[k] for k in self._dead if k in mapping}
        with self._queue.cond:
            items = [(mapping[k], item) for k, item in self._queue.items if k in mapping]
            self._queue.items.clear()
            self._queue.items.extend(items)

    def _drop_queued(self, keys: Iterable[int]) -> None:
        """Forget what ``keys``' workers queued (their workers are replaced)."""
        gone = set(keys)
        with self._queue.cond:
            items = [(k, item) for k, item in self._queue.items if k not in gone]
            self._queue.items.clear()
            self._queue.items.extend(items)

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
                s.request_stop()
        deadline = time.monotonic() + grace_period_s
        for k in keys:
            t = self._threads.get(k)
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    self.leaked_threads.append(k)
