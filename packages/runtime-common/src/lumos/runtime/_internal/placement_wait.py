"""Waiting for a group's actors to be placed and started ("waiting for resources").

A start says it waits for resources only when the workers' placement groups are not
placed after ``WAITING_FIRST_S``: placed workers hold their resources, and a worker
process that takes a while to start (a busy node, a cold Python) is not a shortage.
Placed workers whose processes are still not running after ``WAITING_STARTING_S``
get a line of their own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup

from lumos.runtime._internal import messages
from lumos.runtime._internal.actor_factory import new_worker_actor, release_quietly
from lumos.runtime._internal.errors import WorkerGroupStartError
from lumos.runtime._internal.multiplexer import describe_actor_error
from lumos.runtime._internal.placement import actor_options
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")

WAITING_FIRST_S = 3.0
"""The first "waiting for resources" line comes after this long (placement not done)."""
WAITING_EVERY_S = 15.0
"""Then one line every this long while still waiting."""
WAITING_STARTING_S = 30.0
"""Placed workers not started after this long get a "workers starting slowly" line."""


def start_workers(
    spec: WorkerGroupSpec,
    slots: list[tuple[PlacementGroup, int]],
    warm: list[str] | None = None,
    on_waiting: Callable[[str], None] | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Start one worker actor per ``(placement group, bundle index)``; wait for each.

    Args:
        spec: The group's spec (resources, runtime_env, env_vars, timeout).
        slots: Where each worker runs.
        warm: Modules each worker imports before it reports (``None``: none).
        on_waiting: See ``wait_until_started``.

    Returns:
        ``(actors, setup metas)``, in the order of ``slots``.

    Raises:
        WorkerGroupStartError: One did not start in time or failed; all are killed first.
    """
    opts = actor_options(spec.resources_per_worker)
    actors: list[Any] = []
    try:
        for pg, bundle in slots:
            actors.append(new_worker_actor(opts, pg, bundle, spec.runtime_env))
        env = dict(spec.env_vars) or None
        refs = [a.setup.remote(env, warm, True) for a in actors]  # SIGTERM: a notice
        groups = {pg.id: pg for pg, _ in slots}
        metas = wait_for_setup(refs, spec, [pg.ready() for pg in groups.values()], on_waiting)
    except BaseException:
        release_quietly(actors)
        raise
    return actors, metas


def wait_for_setup(
    refs: list[Any],
    spec: WorkerGroupSpec,
    placed: Sequence[Any],
    on_waiting: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Wait for every actor's ``setup`` call; bounded by ``spec.placement_timeout_s``.

    Args:
        refs: The actors' ``setup`` calls.
        spec: The group's spec.
        placed: The actors' placement groups' ``ready()`` refs (one for a fixed group).
        on_waiting: Gets the lines of ``wait_until_started``.

    Returns:
        Each actor's setup metadata, in the order of ``refs``.

    Raises:
        WorkerGroupStartError: The timeout passed, or an actor failed to start.
    """
    wait_until_started(refs, len(refs), spec, placed, on_waiting)
    return setup_results(refs)


def wait_until_started(
    refs: list[Any],
    needed: int,
    spec: WorkerGroupSpec,
    placed: Sequence[Any],
    on_waiting: Callable[[str], None] | None = None,
) -> set[int]:
    """Wait until ``needed`` of the ``setup`` calls ``refs`` returned.

    Says "waiting for resources" (to the log, INFO, and to ``on_waiting``) when fewer
    than ``needed`` of the placement groups ``placed`` (their ``ready()`` refs; one
    covers every worker of a fixed group) are placed after ``WAITING_FIRST_S``, then
    every ``WAITING_EVERY_S``; "workers starting slowly" when they are placed but the
    workers have not started after ``WAITING_STARTING_S``.

    Returns:
        The indices of the ``refs`` that returned (at least ``needed``).

    Raises:
        WorkerGroupStartError: ``spec.placement_timeout_s`` passed first.
    """
    if not refs:
        return set()
    start = time.monotonic()
    timeout = spec.placement_timeout_s
    index = {ref: i for i, ref in enumerate(refs)}
    lines = _WaitingLines(spec, placed, min(needed, len(placed)), on_waiting, start)
    while True:
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(done) >= needed:
            return {index[r] for r in done}
        now = time.monotonic()
        wait_s = lines.due_in(now)
        if timeout is not None:
            if now - start >= timeout:
                raise timed_out(spec)
            wait_s = min(wait_s, timeout - (now - start))
        done, _ = ray.wait(refs, num_returns=needed, timeout=wait_s)
        if len(done) < needed and (timeout is None or time.monotonic() - start < timeout):
            lines.tell(len(done), needed, time.monotonic())


class _WaitingLines:
    """When a start says that it waits, and which line."""

    def __init__(
        self,
        spec: WorkerGroupSpec,
        placed: Sequence[Any],
        placements_needed: int,
        on_waiting: Callable[[str], None] | None,
        start: float,
    ) -> None:
        self._spec = spec
        self._placed = list(placed)
        self._placements_needed = placements_needed
        self._on_waiting = on_waiting
        self._start = start
        self._next = start + WAITING_FIRST_S

    def due_in(self, now: float) -> float:
        """Seconds until the next look (a wait never needs to be shorter)."""
        return max(0.0, self._next - now)

    def tell(self, started: int, total: int, now: float) -> None:
        """Say why the start waits, when a line is due and there is something to say."""
        if now < self._next:
            return
        if self._unplaced():
            line = messages.waiting_for_resources(self._spec, started, total, free_resources())
        elif now - self._start >= WAITING_STARTING_S:
            line = messages.still_starting(started, total, now - self._start)
        else:
            self._next = self._start + WAITING_STARTING_S  # merely starting: look again then
            return
        self._next = now + WAITING_EVERY_S
        _say(line, self._on_waiting)

    def _unplaced(self) -> bool:
        if not self._placed:
            return False
        done, _ = ray.wait(self._placed, num_returns=len(self._placed), timeout=0)
        return len(done) < self._placements_needed


def free_resources() -> dict[str, float] | None:
    """Ray's free cluster resources (``None`` when Ray cannot say)."""
    try:
        return dict(ray.available_resources())  # type: ignore[no-untyped-call]
    except Exception:
        return None


def _say(line: str, on_waiting: Callable[[str], None] | None) -> None:
    """Log ``line`` and pass it to ``on_waiting``."""
    logger.info("%s", line)
    if on_waiting is not None:
        try:
            on_waiting(line)
        except Exception:
            logger.warning(messages.ON_WAITING_FAILED, exc_info=True)


def timed_out(spec: WorkerGroupSpec) -> WorkerGroupStartError:
    """The error for a start that did not finish within ``placement_timeout_s``."""
    return WorkerGroupStartError(
        f"could not start {messages.how_many(spec)} worker(s) with {spec.resources_per_worker} "
        f"each (placement_strategy={spec.placement_strategy!r}) within placement_timeout_s="
        f"{spec.placement_timeout_s}; free in the cluster now: "
        f"{messages.free_in_cluster(free_resources())}"
    )


def setup_results(refs: list[Any]) -> list[dict[str, Any]]:
    """Each actor's setup metadata; ``WorkerGroupStartError`` for one that failed."""
    metas: list[dict[str, Any]] = []
    for ref in refs:
        try:
            metas.append(ray.get(ref))
        except (RayActorError, RayTaskError) as exc:
            raise WorkerGroupStartError(
                f"a worker failed to start: {describe_actor_error(exc)}"
            ) from exc
    return metas
