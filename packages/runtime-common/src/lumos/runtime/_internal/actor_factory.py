"""Creating and ending worker actors (shared by WorkerGroup, its standby and WorkerPool)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lumos.runtime._internal.actor import ACTOR_MAX_CONCURRENCY, WorkerActor
from lumos.runtime._internal.errors import RemoteError

logger = logging.getLogger("lumos.runtime")

RemoteWorker: Any = ray.remote(WorkerActor)


def new_worker_actor(
    opts: dict[str, Any],
    pg: PlacementGroup | None = None,
    bundle_index: int = 0,
    runtime_env: dict[str, Any] | None = None,
) -> Any:
    """Create a worker actor: threaded, never restarted by Ray.

    Args:
        opts: Ray actor options, i.e. its resources (see ``placement.actor_options``).
        pg: The placement group to run in (``None``: Ray places the actor).
        bundle_index: The bundle of ``pg`` to use.
        runtime_env: The actor's Ray runtime environment (``WorkerGroupSpec.runtime_env``);
            ``None`` or empty: the job's.

    Returns:
        The actor handle (its ``setup`` call reports where it runs).
    """
    if pg is not None:
        opts = {
            **opts,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle_index
            ),
        }
    if runtime_env:
        opts = {**opts, "runtime_env": runtime_env}
    return RemoteWorker.options(
        max_concurrency=ACTOR_MAX_CONCURRENCY, max_restarts=0, max_task_retries=0, **opts
    ).remote()


def kill_quietly(actor: Any) -> None:
    """``ray.kill`` the actor; a no-op (logged at DEBUG) when it is already gone."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        logger.debug("ray.kill failed (actor already gone)", exc_info=True)


def remove_placement_group_quietly(pg: PlacementGroup) -> None:
    """Remove ``pg``; a failure (already removed, Ray shut down) is logged at DEBUG."""
    try:
        remove_placement_group(pg)
    except Exception:
        logger.debug("remove_placement_group failed", exc_info=True)


def release_quietly(actors: Iterable[Any], pgs: Iterable[PlacementGroup] = ()) -> None:
    """Kill ``actors`` and remove ``pgs``, quietly (a start that failed half-way)."""
    for actor in actors:
        kill_quietly(actor)
    for pg in pgs:
        remove_placement_group_quietly(pg)


def remote_error_from_ray(exc: BaseException, rank: int) -> RemoteError:
    """RemoteError for a failed actor call (user exception or dead actor)."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else None
        name = (
            f"{type(cause).__module__}.{type(cause).__qualname__}"
            if cause
            else "ray.exceptions.RayTaskError"
        )
        return RemoteError(
            name, str(cause) if cause else str(exc), str(exc), cause=cause, rank=rank
        )
    return RemoteError.from_exception(exc, rank=rank)
