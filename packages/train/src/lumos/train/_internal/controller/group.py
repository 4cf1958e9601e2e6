"""The controller's worker group: start, replace failed ranks, wind down, shut down.

Written against ``lumos.runtime.WorkerGroupProtocol``, so a test passes
``FakeCluster.start`` as the factory instead of ``WorkerGroup.start``.
"""

from __future__ import annotations

import time
from dataclasses import replace

from lumos.runtime import (
    ErrorEvent,
    FinishedEvent,
    GroupFactory,
    WorkerDiedEvent,
    WorkerGroupProtocol,
    WorkerGroupSpec,
    WorkerHungEvent,
    WorkerInfo,
)
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.attempt_log import Replacement


class GroupDriver:
    """Owns the run's current worker group (at most one at a time).

    Args:
        factory: Starts a group (``WorkerGroup.start`` or a fake's).
        console: Where the group's state lines go.
        shutdown_grace_s: How long a shut-down worker may take to end.
        stop_grace_s: How long surviving workers get to end their training thread.
    """

    def __init__(
        self,
        factory: GroupFactory,
        console: Console,
        *,
        shutdown_grace_s: float,
        stop_grace_s: float,
    ) -> None:
        self._factory = factory
        self._console = console
        self._shutdown_grace_s = shutdown_grace_s
        self._stop_grace_s = stop_grace_s
        self.group: WorkerGroupProtocol | None = None
        self._avoid: tuple[str, ...] = ()
        self.replaced: list[Replacement] = []  # in the running group since it started
        self.vacant: set[int] = set()  # ranks without a worker (``vacate``)

    @property
    def workers(self) -> list[WorkerInfo]:
        """The current group's workers in rank order (none without a group)."""
        return self.group.workers if self.group is not None else []

    def current(self) -> WorkerGroupProtocol:
        """The running group (the controller only asks while one runs)."""
        if self.group is None:  # pragma: no cover - a controller bug
            raise RuntimeError("lumos.train: no worker group is running")
        return self.group

    def node_of(self, rank: int) -> str | None:
        """The node id of ``rank``'s worker, when known."""
        workers = self.workers
        return workers[rank].node_id if 0 <= rank < len(workers) else None

    def avoid_next(self, nodes: set[str]) -> None:
        """Start the next group off ``nodes`` (where the cluster has another node)."""
        self._avoid = tuple(sorted(nodes))

    def start(self, spec: WorkerGroupSpec) -> WorkerGroupProtocol:
        """Shut down the current group (if any) and start a new one."""
        self.shutdown()
        self.replaced = []
        self.vacant = set()
        if self._avoid and not spec.elastic:
            spec, self._avoid = replace(spec, avoid_nodes=self._avoid), ()
        t0 = time.monotonic()
        group = self._factory(spec, on_waiting=self._console.info)
        self.group = group
        self._console.info(
            messages.started_line(len(group.workers), time.monotonic() - t0, group.workers)
        )
        return group

    def replace_and_wind_down(
        self, dead: list[int], ended: frozenset[int], world_size: int
    ) -> set[int]:
        """Replace the dead ranks; wait until the survivors' training threads ended.

        Args:
            dead: Ranks whose worker process is gone (died or hung).
            ended: Ranks whose training thread already ended.
            world_size: The attempt's number of ranks.

        Returns:
            The survivors that died meanwhile (replaced too).

        Raises:
            TimeoutError: a survivor did not end its thread within ``stop_grace_s``.
        """
        group = self.current()
        group.request_stop()
        if dead:
            self._replace(group, dead)
        extra_dead = self.wind_down(set(range(world_size)) - set(dead) - set(ended))
        if extra_dead:
            self._replace(group, sorted(extra_dead))
        group.poll(0)  # whatever is still queued belongs to the ended attempt: drop it
        return extra_dead

    def wind_down(self, waiting: set[int]) -> set[int]:
        """Wait until the ``waiting`` ranks' training threads ended (after a stop request).

        Returns:
            The ranks among them that died meanwhile (not replaced).

        Raises:
            TimeoutError: a rank did not end its thread within ``stop_grace_s``.
        """
        group = self.current()
        group.request_stop()
        extra_dead: set[int] = set()
        deadline = time.monotonic() + self._stop_grace_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"rank(s) {sorted(waiting)} did not end their training function within "
                    f"{self._stop_grace_s:.0f} s"
                )
            for event in group.poll(min(remaining, 1.0)):
                if event.rank not in waiting:
                    continue
                if isinstance(event, FinishedEvent | ErrorEvent):
                    waiting.discard(event.rank)
                elif isinstance(event, WorkerDiedEvent | WorkerHungEvent):
                    waiting.discard(event.rank)
                    extra_dead.add(event.rank)
        return extra_dead

    def resize(self, remove: list[int], target: int, wait_s: float) -> tuple[int, int, float]:
        """Elastic groups: drop ``remove`` (ranks whose functions ended) and the vacant
        ranks, then grow toward ``target`` workers with what can be placed within ``wait_s``.

        Returns:
            ``(size before, size after, seconds)``.
        """
        group = self.current()
        t0 = time.monotonic()
        before = len(group.workers) - len(self.vacant)
        remove = sorted(set(remove) | self.vacant)
        self.vacant = set()
        if remove:
            group.remove_workers(remove)
        missing = target - len(group.workers)
        if missing > 0:
            group.add_workers(missing, timeout_s=wait_s)
        group.poll(0)  # whatever is still queued belongs to the ended attempt: drop it
        return before, len(group.workers), time.monotonic() - t0

    def vacate(self, ranks: list[int]) -> None:
        """Elastic groups: leave ``ranks`` without a worker; the others keep running and
        keep their ranks (``WorkerGroup.vacate_workers``)."""
        self.current().vacate_workers(sorted(ranks))
        self.vacant |= set(ranks)

    def refill(self, ranks: list[int], wait_s: float) -> list[int]:
        """Elastic groups: new workers for ``ranks`` (vacant ones, or live ones that move)
        placed within ``wait_s``; returns the ranks that got one."""
        t0 = time.monotonic()
        result = self.current().refill_workers(sorted(ranks), timeout_s=wait_s)
        if result.added:
            self.vacant -= set(result.added)
            self.replaced.append(Replacement(tuple(result.added), tuple(result.from_standby)))
            seconds = time.monotonic() - t0
            self._console.info(messages.replaced_line(result.added, result.from_standby, seconds))
        return list(result.added)

    def add(self, count: int, wait_s: float) -> list[int]:
        """Elastic groups: up to ``count`` more ranks placed within ``wait_s`` (new numbers)."""
        return list(self.current().add_workers(count, timeout_s=wait_s).added)

    def replace_ranks(self, ranks: list[int]) -> None:
        """Replace ``ranks``' workers (the standby first) while the others keep running."""
        self._replace(self.current(), ranks)

    def _replace(self, group: WorkerGroupProtocol, ranks: list[int]) -> None:
        t0 = time.monotonic()
        by_standby = sorted(group.replace_workers(ranks) or [])
        self.replaced.append(Replacement(tuple(ranks), tuple(by_standby)))
        self._console.info(messages.replaced_line(ranks, by_standby, time.monotonic() - t0))

    def shutdown(self) -> bool:
        """Shut the group down (if any); False when that raised (workers may still run)."""
        group, self.group = self.group, None
        if group is None:
            return True
        try:
            group.shutdown(self._shutdown_grace_s)
        except Exception as exc:  # cleanup must not hide the run's own error
            self._console.warning(messages.cleanup_failed_line(exc))
            return False
        return True
