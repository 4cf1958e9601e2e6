"""``FakeWorkerPool``: an in-process ``WorkerPool`` (threads instead of actors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lumos.runtime._internal.errors import LumosRuntimeError
from lumos.runtime._internal.events import Event
from lumos.runtime._internal.fake_workers import FakeWorkers
from lumos.runtime._internal.spec import validate_resources


class FakeWorkerPool(FakeWorkers):
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
        self.worker_resources: dict[int, dict[str, float]] = {}

    @property
    def worker_ids(self) -> list[int]:
        """Ids of all workers (pending included)."""
        return list(self._ids)

    def add_worker(self, resources: dict[str, float] | None = None) -> int:
        """Add a fake worker with ``resources`` (``None``: the pool's); returns its id.

        ``worker_resources[id]`` records each worker's resources for tests.
        """
        self._check_open()
        if resources is not None:
            validate_resources(resources, "add_worker(resources)", allow_zero=True)
        wid = self._next_id
        self._next_id += 1
        self._ids.append(wid)
        shape = self.resources_per_worker if resources is None else resources
        self.worker_resources[wid] = dict(shape)
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
            s.deliver(value)

    def request_stop(self, worker_id: int) -> None:
        """Set that worker's stop flag."""
        s = self._sessions.get(worker_id)
        if s is not None:
            s.request_stop()

    def remove_worker(self, worker_id: int) -> None:
        """Forget the worker (its thread is asked to stop)."""
        if worker_id in self._ids:
            self._ids.remove(worker_id)
            self.removed.append(worker_id)
            s = self._sessions.get(worker_id)
            if s is not None:
                s.request_stop()
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
