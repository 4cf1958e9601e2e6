"""Waiting for a group's actors to be placed and started ("waiting for resources")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from lumos.runtime._internal.errors import WorkerGroupStartError
from lumos.runtime._internal.multiplexer import describe_actor_error
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")

WAITING_FIRST_S = 3.0
"""The first "waiting for resources" line comes after this long."""
WAITING_EVERY_S = 15.0
"""Then one line every this long while still waiting."""


def wait_for_setup(
    refs: list[Any],
    spec: WorkerGroupSpec,
    on_waiting: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Wait for every actor's ``setup`` call; bounded by ``spec.placement_timeout_s``.

    Reports "waiting for resources" after ``WAITING_FIRST_S``, then every
    ``WAITING_EVERY_S``, to the log (INFO) and to ``on_waiting``.

    Returns:
        Each actor's setup metadata, in the order of ``refs``.

    Raises:
        WorkerGroupStartError: The timeout passed, or an actor failed to start.
    """
    start = time.monotonic()
    timeout = spec.placement_timeout_s
    pending = list(refs)
    next_wait = WAITING_FIRST_S
    while pending:
        wait_s = next_wait
        if timeout is not None:
            wait_s = min(wait_s, timeout - (time.monotonic() - start))
        if wait_s <= 0:
            raise timed_out(spec)
        _ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        if pending and (timeout is None or time.monotonic() - start < timeout):
            next_wait = WAITING_EVERY_S
            report_waiting(spec, len(refs) - len(pending), len(refs), on_waiting)
    return setup_results(refs)


def waiting_message(
    spec: WorkerGroupSpec, started: int, total: int, available: dict[str, float]
) -> str:
    """The "waiting for resources" line: what is requested and what is free."""
    free = ", ".join(f"{k}={v:g}" for k, v in sorted(available.items())) or "unknown"
    return (
        f"waiting for resources: {started} of {total} worker(s) started; requested "
        f"{_how_many(spec)} worker(s) x {dict(spec.resources_per_worker)} "
        f"(placement_strategy={spec.placement_strategy!r}); free in the cluster now: {free}"
    )


def _how_many(spec: WorkerGroupSpec) -> str:
    if spec.min_workers is None or spec.min_workers == spec.num_workers:
        return str(spec.num_workers)
    return f"{spec.min_workers} (min_workers) to {spec.num_workers}"


def available_resources() -> dict[str, float]:
    """Free cluster resources without the per-node entries (``{}`` when Ray cannot say)."""
    try:
        return {
            k: v
            for k, v in ray.available_resources().items()  # type: ignore[no-untyped-call]
            if not k.startswith("node:")
        }
    except Exception:
        return {}


def report_waiting(
    spec: WorkerGroupSpec, started: int, total: int, on_waiting: Callable[[str], None] | None
) -> None:
    """Log the "waiting for resources" line and pass it to ``on_waiting``."""
    message = waiting_message(spec, started, total, available_resources())
    logger.info("%s", message)
    if on_waiting is not None:
        try:
            on_waiting(message)
        except Exception:
            logger.warning("on_waiting callback failed", exc_info=True)


def timed_out(spec: WorkerGroupSpec) -> WorkerGroupStartError:
    """The error for a start that did not finish within ``placement_timeout_s``."""
    return WorkerGroupStartError(
        f"could not start {_how_many(spec)} worker(s) with {spec.resources_per_worker} each "
        f"(placement_strategy={spec.placement_strategy!r}) within placement_timeout_s="
        f"{spec.placement_timeout_s}; cluster resources available now: {available_resources()}"
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
