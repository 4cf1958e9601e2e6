"""``FakeWorkerGroup`` (an in-process ``WorkerGroup``) and ``FakeCluster`` (its scripted starts)."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

from lumos.runtime._internal.errors import (
    RemoteError,
    RuntimeConfigError,
    RuntimeUsageError,
    WorkerGroupError,
    WorkerGroupStartError,
)
from lumos.runtime._internal.events import Event, WorkerPreemptedEvent
from lumos.runtime._internal.fake_workers import FakeWorkers
from lumos.runtime._internal.policies import FreeResources, GroupState
from lumos.runtime._internal.preemption import PreemptionBox, PreemptionInfo
from lumos.runtime._internal.relay import CollectiveRelay
from lumos.runtime._internal.resize import ResizeResult, group_state
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec

T = TypeVar("T")


class FakeWorkerGroup(FakeWorkers):
    """In-process stand-in for ``WorkerGroup`` (same methods, no Ray).

    Args:
        spec: The group spec (``num_workers``, ``min_workers`` are used; resources are ignored).
        num_nodes: Spread the fake workers over this many fake nodes (contiguous ranks).
        fit: Elastic groups only: how many workers the fake cluster holds. The group
            starts with ``fit`` clamped to ``[min_workers, num_workers]``; what is left
            over becomes ``free_workers``. ``None``: ``num_workers`` fit, none free.

    Attributes:
        launches: One dict per ``launch`` call (fn, args, kwargs, per_rank_kwargs, session_info).
        sent: ``(value, ranks)`` per ``send`` call.
        replaced: Ranks passed to ``replace_workers``, per call.
        resizes: The result of every ``remove_workers`` / ``add_workers`` call.
        free_workers: How many more workers the fake cluster has room for; set it to
            script capacity coming back (``add_workers`` uses it, ``free_resources``
            reports it as ``resources_per_worker`` times this on one fake node).
        shutdown_calls: How often ``shutdown`` was called.
        failing_starts: How many more ``refill_workers`` calls fail to start their
            workers (``WorkerGroupStartError``), as a real start can.
    """

    def __init__(self, spec: WorkerGroupSpec, num_nodes: int = 1, fit: int | None = None) -> None:
        super().__init__()
        self.spec = spec
        n = spec.num_workers
        self.free_workers = 0
        if spec.min_workers is not None and fit is not None:
            n = max(spec.min_workers, min(spec.num_workers, fit))
            self.free_workers = max(0, fit - n)
        per_node = -(-n // max(1, num_nodes))
        self.workers: list[WorkerInfo] = _infos(
            [f"fake-node-{rank // per_node}" for rank in range(n)]
        )
        self._relay = CollectiveRelay(n, self._send_control)
        self.replaced: list[list[int]] = []
        self.resizes: list[ResizeResult] = []
        self._notices: dict[int, tuple[int | None, str]] = {}  # rank -> (deadline, reason)
        self._added_nodes = 0
        self._vacant: set[int] = set()
        self.failing_starts = 0
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
        ranks: list[int] | None = None,
    ) -> None:
        """Start ``fn`` in one thread per rank (as ``WorkerGroup.launch``; ``ranks``: only those)."""
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
        if ranks is None and self._vacant:
            raise RuntimeUsageError(
                f"launch() on every rank while {sorted(self._vacant)} are vacant"
            )
        if ranks is None:
            self._relay.world_size = len(self.workers)
            self._relay.reset()
        for rank, info in enumerate(self.workers):
            if rank in self._dead or (ranks is not None and rank not in ranks):
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
        self._dead |= set(ranks)  # the old threads' last events are dropped, as Ray's are
        self._stop_all(ranks, 1.0)
        self._drop_queued(ranks)
        self._relay.excuse(list(ranks))
        for r in ranks:
            self._dead.discard(r)
            self._sessions.pop(r, None)
        return []

    # -- elastic (as WorkerGroup) -----------------------------------------------------
    def remove_workers(self, ranks: list[int]) -> ResizeResult:
        """Drop ``ranks`` (their threads are asked to stop) and re-number the others."""
        self._check_open()
        t0 = time.monotonic()
        self._require_elastic("remove_workers")
        n = len(self.workers)
        gone = sorted(set(ranks))
        if any(not 0 <= r < n for r in gone) or len(gone) >= n:
            raise RuntimeUsageError(
                f"remove_workers(ranks={ranks!r}) is invalid: ranks must be in 0..{n - 1} "
                "and at least one worker must stay"
            )
        self._stop_all(gone, 1.0)
        keep = [r for r in range(n) if r not in gone]
        mapping = {old: new for new, old in enumerate(keep)}
        self._rekey(mapping)
        self._vacant = {mapping[r] for r in self._vacant if r in mapping}
        self._notices = {mapping[r]: v for r, v in self._notices.items() if r in mapping}
        self.workers = _infos([self.workers[r].node_id for r in keep])
        result = ResizeResult(
            mapping, removed=gone, world_size=len(keep), elapsed_s=time.monotonic() - t0
        )
        self._after_resize(result)
        return result

    def add_workers(self, count: int, timeout_s: float = 0.0) -> ResizeResult:
        """Add up to ``count`` workers, at most ``free_workers`` (each on a new fake node)."""
        self._check_open()
        t0 = time.monotonic()
        self._require_elastic("add_workers")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise RuntimeUsageError(f"add_workers(count={count!r}) is invalid: must be an int >= 1")
        n = len(self.workers)
        k = max(0, min(count, self.free_workers, self.spec.num_workers - n))
        self.free_workers -= k
        nodes = [w.node_id for w in self.workers]
        for _ in range(k):
            nodes.append(f"fake-node-added-{self._added_nodes}")
            self._added_nodes += 1
        self.workers = _infos(nodes)
        result = ResizeResult(
            {r: r for r in range(n)},
            added=list(range(n, n + k)),
            world_size=n + k,
            elapsed_s=time.monotonic() - t0,
        )
        self._after_resize(result)
        return result

    def vacate_workers(self, ranks: list[int]) -> ResizeResult:
        """End ``ranks``' threads; they stay vacant, nothing is re-numbered (as
        ``WorkerGroup.vacate_workers``; their capacity is gone, like a lost node's)."""
        self._check_open()
        self._require_elastic("vacate_workers")
        n = len(self.workers)
        gone = sorted(set(ranks))
        if any(not 0 <= r < n for r in gone) or not set(range(n)) - self._vacant - set(gone):
            raise RuntimeUsageError(f"vacate_workers(ranks={ranks!r}) is invalid")
        self._stop_all(gone, 1.0)
        self._dead |= set(gone)
        self._vacant |= set(gone)
        self._relay.excuse(gone)
        live = {r: r for r in range(n) if r not in self._vacant}
        result = ResizeResult(live, removed=gone, world_size=n)
        self._after_resize(result)
        return result

    def refill_workers(self, ranks: list[int], timeout_s: float = 0.0) -> ResizeResult:
        """New workers for ``ranks`` (vacant, or live ones that move), at most
        ``free_workers``, each on a new fake node (as ``WorkerGroup.refill_workers``)."""
        self._check_open()
        n = len(self.workers)
        if any(not 0 <= r < n for r in ranks):
            raise RuntimeUsageError(f"refill_workers(ranks={ranks!r}) is invalid")
        filled = list(dict.fromkeys(ranks))[: max(0, self.free_workers)]
        if filled and self.failing_starts > 0:
            self.failing_starts -= 1
            raise WorkerGroupStartError(f"a worker for rank(s) {filled} failed to start (scripted)")
        self.free_workers -= len(filled)
        self._dead |= set(filled)  # a live rank moves: its old thread's last events are dropped
        self._stop_all(filled, 1.0)
        self._drop_queued(filled)
        self._relay.excuse(filled)
        nodes = [w.node_id for w in self.workers]
        for r in filled:
            self._dead.discard(r)
            self._vacant.discard(r)
            self._sessions.pop(r, None)
            self._notices.pop(r, None)
            nodes[r] = f"fake-node-added-{self._added_nodes}"
            self._added_nodes += 1
        self.workers = _infos(nodes)
        live = {r: r for r in range(n) if r not in self._vacant}
        result = ResizeResult(live, added=filled, world_size=n)
        self._after_resize(result)
        return result

    def free_resources(self) -> FreeResources:
        """``free_workers`` times ``resources_per_worker``, on one fake node."""
        if self.free_workers <= 0:
            return FreeResources()
        res = {k: float(v) * self.free_workers for k, v in self.spec.resources_per_worker.items()}
        return FreeResources({"fake-free-node": res})

    def scaling_state(self, lost_ranks: list[int] | None = None) -> GroupState:
        """As ``WorkerGroup.scaling_state`` (vacant ranks count as lost)."""
        lost = sorted(set(lost_ranks or ()) | self._vacant)
        return group_state(self.spec, len(self.workers), self.preemption_info(), lost)

    def preemption_info(self) -> PreemptionInfo | None:
        """The scripted notices (``preempt_workers``) of the current workers."""
        if not self._notices:
            return None
        node_to_ranks: dict[str, list[int]] = {}
        for rank in sorted(self._notices):
            node_to_ranks.setdefault(self.workers[rank].node_id, []).append(rank)
        deadlines = [d for d, _ in self._notices.values() if d]
        return PreemptionInfo(min(deadlines, default=None), node_to_ranks)

    def preempt_workers(
        self, ranks: list[int], deadline_ms: int | None = None, reason: str = "node draining"
    ) -> None:
        """Script a preemption notice: a ``WorkerPreemptedEvent`` per rank (after what is
        queued), and every rank's ``session.preemption_info()`` returns the group's notice."""
        for rank in ranks:
            if rank not in self._notices:
                self._notices[rank] = (deadline_ms, reason)
                self.inject(
                    WorkerPreemptedEvent(rank, self.workers[rank].node_id, deadline_ms, reason)
                )
        self._push_notice()

    def _push_notice(self) -> None:
        info = self.preemption_info()
        for rank in range(len(self.workers)):
            box = self._boxes.get(rank)
            if box is None:
                box = self._boxes[rank] = PreemptionBox()
            box.set_group(info)

    def _after_resize(self, result: ResizeResult) -> None:
        self.resizes.append(result)
        self._push_notice()

    def _require_elastic(self, what: str) -> None:
        if not self.spec.elastic:
            raise RuntimeUsageError(
                f"{what}() needs an elastic group: start it with WorkerGroupSpec(min_workers=...) "
                "(a fixed-size group replaces failed ranks with replace_workers())"
            )

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


def _infos(nodes: list[str]) -> list[WorkerInfo]:
    """Fake WorkerInfos for workers on ``nodes`` (index == world rank)."""
    order: list[str] = []
    for n in nodes:
        if n not in order:
            order.append(n)
    seen: dict[str, int] = {}
    infos: list[WorkerInfo] = []
    for rank, node in enumerate(nodes):
        local = seen.get(node, 0)
        seen[node] = local + 1
        infos.append(
            WorkerInfo(
                world_rank=rank,
                world_size=len(nodes),
                local_rank=local,
                local_world_size=nodes.count(node),
                node_rank=order.index(node),
                node_id=node,
                node_ip="127.0.0.1",
                pid=os.getpid(),
                gpu_ids=[],
            )
        )
    return infos


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
        fit: How many workers the fake cluster holds (elastic specs; see
            ``FakeWorkerGroup``); ``None``: every group gets ``num_workers``.

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
        fit: int | None = None,
    ) -> None:
        self._script: collections.deque[StartAction] = collections.deque(script)
        self.num_nodes = num_nodes
        self.fit = fit
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
        group = FakeWorkerGroup(spec, num_nodes=self.num_nodes, fit=self.fit)
        if action is not None:
            action(group)
        self.groups.append(group)
        return group
