"""What a driver may call on a worker group or a worker pool.

``WorkerGroup`` / ``WorkerPool`` and the in-process fakes of ``lumos.runtime.testing``
(``FakeWorkerGroup`` / ``FakeWorkerPool``) all implement these protocols; the Train
and Tune controllers are written against them, so a test swaps Ray for a fake by
passing a different factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from lumos.runtime._internal.events import Event
from lumos.runtime._internal.policies import FreeResources, GroupState
from lumos.runtime._internal.preemption import PreemptionInfo
from lumos.runtime._internal.resize import ResizeResult
from lumos.runtime._internal.session import WorkerInfo
from lumos.runtime._internal.spec import WorkerGroupSpec


class WorkerGroupProtocol(Protocol):
    """A gang of ranked workers running one function together."""

    @property
    def workers(self) -> list[WorkerInfo]:
        """Every rank's worker, in rank order."""
        ...

    def launch(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        per_rank_kwargs: list[dict[str, Any]] | None = None,
        session_info: dict[str, Any] | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        """Start ``fn`` on every rank (in a thread of each worker); ``ranks``: only those."""
        ...

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Wait up to ``timeout_s`` for events from any rank."""
        ...

    def send(self, value: Any, ranks: list[int] | None = None) -> None:
        """Deliver ``value`` to the user threads of ``ranks`` (all when ``None``)."""
        ...

    def request_stop(self) -> None:
        """Ask every rank's function to stop (``StopRequested`` at its next API call)."""
        ...

    def replace_workers(self, ranks: list[int]) -> list[int]:
        """Replace dead ``ranks``; returns the ranks a standby worker took over."""
        ...

    def remove_workers(self, ranks: list[int]) -> ResizeResult:
        """Elastic shrink: drop ``ranks``, re-number the survivors (processes kept)."""
        ...

    def add_workers(self, count: int, timeout_s: float = 0.0) -> ResizeResult:
        """Elastic grow: add up to ``count`` workers placed within ``timeout_s``."""
        ...

    def vacate_workers(self, ranks: list[int]) -> ResizeResult:
        """Elastic shrink in place: end ``ranks``' workers; no rank is re-numbered."""
        ...

    def refill_workers(self, ranks: list[int], timeout_s: float = 0.0) -> ResizeResult:
        """Elastic: new workers for vacant ``ranks`` (or moved live ones) placed in time."""
        ...

    def free_resources(self) -> FreeResources:
        """Free resources of the cluster's schedulable nodes (for a ``ScalingPolicy``)."""
        ...

    def scaling_state(self, lost_ranks: list[int] | None = None) -> GroupState:
        """The group as a ``ScalingPolicy`` sees it."""
        ...

    def preemption_info(self) -> PreemptionInfo | None:
        """The group's current preemption notice, or ``None``."""
        ...

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop every worker and release its resources."""
        ...


class GroupFactory(Protocol):
    """Starts a worker group: ``WorkerGroup.start`` or ``FakeCluster.start``.

    ``on_waiting`` gets a one-line "waiting for resources: ..." message while the
    group cannot be placed yet (and a "workers starting slowly: ..." one when it is
    placed but its worker processes take long to start).
    """

    def __call__(
        self, spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
    ) -> WorkerGroupProtocol: ...


class WorkerPoolProtocol(Protocol):
    """Independent, reusable workers, each running one function at a time."""

    def add_worker(self, resources: dict[str, float] | None = None) -> int:
        """Create a worker with ``resources`` (``None``: the pool's); returns its id."""
        ...

    def ready(self, worker_id: int) -> bool:
        """True once the worker has started."""
        ...

    def pending_workers(self) -> list[int]:
        """Workers created but not started yet (waiting for resources)."""
        ...

    def launch(
        self,
        worker_id: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        session_info: dict[str, Any] | None = None,
    ) -> None:
        """Start ``fn`` on one worker."""
        ...

    def poll(self, timeout_s: float | None) -> list[Event]:
        """Wait up to ``timeout_s`` for events from any worker."""
        ...

    def send(self, worker_id: int, value: Any) -> None:
        """Deliver ``value`` to the user thread of one worker (``session.receive()``)."""
        ...

    def request_stop(self, worker_id: int) -> None:
        """Ask one worker's function to stop."""
        ...

    def remove_worker(self, worker_id: int) -> None:
        """Stop and forget one worker."""
        ...

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop every worker."""
        ...


class PoolFactory(Protocol):
    """Creates a worker pool for workers that each need ``resources``.

    ``WorkerPool`` and ``FakeWorkerPool`` (the classes themselves) are pool factories;
    the resources are passed positionally.
    """

    def __call__(self, resources: dict[str, float], /) -> WorkerPoolProtocol: ...
