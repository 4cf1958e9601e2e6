"""``FakeWorkerGroup`` (an in-process ``WorkerGroup``) and ``FakeCluster`` (its scripted starts)."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

from lumos.runtime._internal.errors import RemoteError, RuntimeConfigError, WorkerGroupError
from lumos.runtime._internal.events import Event
from lumos.runtime._internal.fake_workers import FakeWorkers
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec

T = TypeVar("T")


class FakeWorkerGroup(FakeWorkers):
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
            raise RuntimeConfigError(
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
                s.deliver(value)

    def request_stop(self) -> None:
        """Set every session's stop flag."""
        for s in self._sessions.values():
            s.request_stop()

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
                s.deliver_control(key, value)

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
