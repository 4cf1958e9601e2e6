"""Worker side: the session a user function talks to, and the queues behind it.

The same classes serve the Ray worker actor and the in-process
``lumos.runtime.testing.FakeWorkerGroup``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lumos.runtime._internal.current import CurrentSlot
from lumos.runtime._internal.errors import StopRequested
from lumos.runtime._internal.preemption import PreemptionBox, PreemptionInfo

# Raw event kinds as they travel from worker to owner (tuples are cheap to pickle).
REPORT = "R"
FINISHED = "F"
ERROR = "E"
COLLECTIVE = "C"
PREEMPT = "P"
"""A SIGTERM of the worker process: data is ``(deadline_ms, reason)``."""

RawEvent = tuple[str, int, Any]
"""(kind, seq, data); seq is the report index for REPORT, else -1."""


@dataclass(frozen=True)
class WorkerInfo:
    """Where one worker of a group runs and which ranks it has.

    Attributes:
        world_rank: Rank in the group (index into ``WorkerGroup.workers``).
        world_size: Number of workers in the group.
        local_rank: Rank among the group's workers on the same node.
        local_world_size: Number of the group's workers on that node.
        node_rank: Index of the node (the owner's node first when it hosts workers).
        node_id: Ray node id (hex).
        node_ip: IP address of the node.
        pid: Process id of the worker actor.
        gpu_ids: GPUs Ray assigned to the worker.
    """

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_id: str
    node_ip: str
    pid: int
    gpu_ids: list[int] = field(default_factory=list)


class Outbox(Protocol):
    """Where a session puts raw events (an EventQueue, or the fake group's queue)."""

    def put(self, item: RawEvent) -> None: ...


class EventQueue:
    """Worker-side outbox: ``put`` never blocks; ``drain`` long-polls for a batch."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: collections.deque[RawEvent] = collections.deque()

    def put(self, item: RawEvent) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def drain(self, max_wait_s: float) -> list[RawEvent]:
        """Everything queued, waiting up to ``max_wait_s`` for the first item."""
        with self._cond:
            if not self._items and max_wait_s > 0:
                self._cond.wait_for(lambda: bool(self._items), timeout=max_wait_s)
            items = list(self._items)
            self._items.clear()
            return items

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


_NOTHING = object()


class WorkerSession:
    """What a user function running on a worker uses to talk to its owner.

    Get it inside the user function with ``lumos.runtime.worker.get_session()``.

    Attributes:
        info: The worker's ranks and placement (``None`` on a ``WorkerPool`` worker).
        session_info: Free-form dict the owner passed to ``launch``.
        stop_event: ``threading.Event`` set when the owner requests a stop (same moment
            as ``stop_requested`` turns True); usable as ``JobContext.stop_event``.

    Example:
        >>> from lumos.runtime import worker
        >>> def fn():
        ...     session = worker.get_session()
        ...     for step in range(3):
        ...         session.emit({"step": step})
        ...     session.barrier()
    """

    def __init__(
        self,
        info: WorkerInfo | None,
        session_info: dict[str, Any] | None,
        outbox: Outbox,
        preemption: PreemptionBox | None = None,
    ) -> None:
        self.info = info
        self._preemption = preemption if preemption is not None else PreemptionBox()
        self.session_info: dict[str, Any] = dict(session_info or {})
        self._outbox = outbox
        self._report_seq = 0
        self._seq_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._inbox: collections.deque[Any] = collections.deque()
        self._control: dict[tuple[str, int], Any] = {}
        self._stop = False
        self.stop_event = threading.Event()
        """Set when the owner requests a stop (wait on it, or hand it to nested jobs)."""
        self._barrier_count = 0
        self._bcast_count = 0

    # -- user API ---------------------------------------------------------------------
    def emit(self, payload: Any) -> None:
        """Send ``payload`` to the owner as a ``ReportEvent`` (never blocks).

        Args:
            payload: Any picklable value; the runtime does not look inside it.
        """
        with self._seq_lock:
            seq = self._report_seq
            self._report_seq = seq + 1
            self._outbox.put((REPORT, seq, payload))

    def receive(self, timeout_s: float | None = None) -> Any:
        """The next value the owner sent with ``send()`` (in send order).

        Args:
            timeout_s: Seconds to wait; ``None`` waits until a value or a stop.

        Raises:
            StopRequested: A stop was requested while waiting (or before).
            TimeoutError: Nothing arrived within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._inbox:
                    return self._inbox.popleft()
                if self._stop:
                    raise StopRequested("the owner requested a stop")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"nothing received within {timeout_s} s")
                self._cond.wait(remaining)

    def preemption_info(self) -> PreemptionInfo | None:
        """The imminent preemption of some of the group's workers, or ``None``.

        Set when Ray marks a node of the group as draining or a worker process gets
        SIGTERM; every rank sees the group's merged notice (ranks per node, earliest
        deadline), so the function can save a checkpoint before ``deadline_ms``. Ranks
        learn of it at slightly different moments: agree on the step to act on (e.g.
        through the owner) when every rank must act at the same step.

        Example:
            >>> info = worker.get_session().preemption_info()
            >>> if info is not None and rank in info.preempted_ranks: ...
        """
        return self._preemption.get()

    @property
    def stop_requested(self) -> bool:
        """True once the owner asked this job to stop."""
        return self._stop

    def raise_if_stop_requested(self) -> None:
        """Raise ``StopRequested`` when the owner asked this job to stop."""
        if self._stop:
            raise StopRequested("the owner requested a stop")

    def barrier(self) -> None:
        """Block until every worker of the group reached its barrier (owner-relayed).

        Raises:
            StopRequested: A stop was requested while waiting.
        """
        if self._world_size() <= 1:
            return
        with self._cond:
            key = ("barrier", self._barrier_count)
            self._barrier_count += 1
        self._outbox.put((COLLECTIVE, -1, (key, None)))
        self._wait_control(key)

    def broadcast_from_rank_zero(self, value: Any = None) -> Any:
        """Return rank 0's ``value`` on every rank (other ranks' values are ignored).

        Raises:
            StopRequested: A stop was requested while waiting.
        """
        if self._world_size() <= 1:
            return value
        with self._cond:
            key = ("bcast", self._bcast_count)
            self._bcast_count += 1
        rank = self.info.world_rank if self.info is not None else 0
        self._outbox.put((COLLECTIVE, -1, (key, value if rank == 0 else None)))
        return self._wait_control(key)

    # -- runtime side (the worker actor and the in-process fakes; not for user code) ---
    def deliver(self, value: Any) -> None:
        """Append ``value`` to the inbox that ``receive()`` reads (runtime side).

        Called by the worker actor for ``WorkerGroup.send`` / ``WorkerPool.send`` and by
        the fakes of ``lumos.runtime.testing``; user functions use ``receive()``.
        """
        with self._cond:
            self._inbox.append(value)
            self._cond.notify_all()

    def deliver_control(self, key: tuple[str, int], value: Any) -> None:
        """Release the barrier / broadcast ``key`` with ``value`` (runtime side, owner relay)."""
        with self._cond:
            self._control[key] = value
            self._cond.notify_all()

    def request_stop(self) -> None:
        """Set the stop flag and ``stop_event``; wakes ``receive()`` / ``barrier()`` (runtime side).

        User functions see it as ``stop_requested`` or ``StopRequested``.
        """
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.stop_event.set()

    def _world_size(self) -> int:
        return self.info.world_size if self.info is not None else 1

    def _wait_control(self, key: tuple[str, int]) -> Any:
        with self._cond:
            while True:
                value = self._control.pop(key, _NOTHING)
                if value is not _NOTHING:
                    return value
                if self._stop:
                    raise StopRequested("the owner requested a stop")
                self._cond.wait()


current_session: CurrentSlot[WorkerSession] = CurrentSlot()
"""The session of the job running in this process (one job per worker process at a time).

``run_user_fn`` activates it in the user thread, so that thread sees it first and any
thread the user function starts sees it as the process's only active session. The
in-process fakes run several workers as threads of one process: each thread sees its
own session. Ending a function deactivates only its own session, so a newer launch's
session is never cleared by an older thread.
"""


def get_session() -> WorkerSession | None:
    """The session of the job running in this process, or ``None`` outside a worker.

    Inside a user function (and in threads it starts) this is its ``WorkerSession``.
    """
    return current_session.get()


def run_user_fn(
    session: WorkerSession,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outbox: Outbox,
    make_error: Callable[[BaseException], Any],
) -> None:
    """Body of the user thread: make ``session`` current, run ``fn``, queue FINISHED or ERROR.

    The session is deactivated before the outcome is queued, so an owner that sees the
    outcome and launches again never finds the old session current.
    """
    current_session.activate(session)
    try:
        result = fn(*args, **kwargs)
    except StopRequested:
        current_session.deactivate(session)
        outbox.put((FINISHED, -1, (None, True)))
    except BaseException as exc:
        current_session.deactivate(session)
        outbox.put((ERROR, -1, make_error(exc)))
    else:
        current_session.deactivate(session)
        outbox.put((FINISHED, -1, (result, False)))
