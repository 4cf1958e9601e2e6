"""The text of every console line the runtime writes (the ``lumos.runtime`` logger and
the ``on_waiting`` callback of ``WorkerGroup.start``).

Error messages stay where they are raised; debug lines stay beside their code.
"""

from __future__ import annotations

from collections.abc import Mapping

from lumos.runtime._internal.resources import format_resources
from lumos.runtime._internal.spec import WorkerGroupSpec

ON_WAITING_FAILED = "on_waiting callback failed"
STANDBY_OTHER_RUNTIME_ENV = "the standby worker has another runtime_env; starting a new worker"
SIGTERM_NOTICE_FAILED = "recording a SIGTERM preemption notice failed"


def how_many(spec: WorkerGroupSpec) -> str:
    """``"4"``, or ``"2 (min_workers) to 4"`` for an elastic group."""
    if spec.min_workers is None or spec.min_workers == spec.num_workers:
        return str(spec.num_workers)
    return f"{spec.min_workers} (min_workers) to {spec.num_workers}"


def free_in_cluster(available: Mapping[str, float] | None) -> str:
    """The cluster's free resources a user can ask for (``"unknown"``: Ray cannot say)."""
    return "unknown" if available is None else format_resources(available)


def waiting_for_resources(
    spec: WorkerGroupSpec, started: int, total: int, available: Mapping[str, float] | None
) -> str:
    """The "waiting for resources" line: the workers' placement is not done yet."""
    return (
        f"waiting for resources: {started} of {total} worker(s) started; requested "
        f"{how_many(spec)} worker(s) x {dict(spec.resources_per_worker)} "
        f"(placement_strategy={spec.placement_strategy!r}); free in the cluster now: "
        f"{free_in_cluster(available)}"
    )


def still_starting(started: int, total: int, waited_s: float) -> str:
    """The line for workers that are placed (their resources held) but not started yet."""
    return (
        f"workers starting slowly: {started} of {total} worker(s) started after "
        f"{waited_s:.0f} s; their resources are reserved, their processes are still "
        "starting (a runtime_env being set up, or a busy node)"
    )


def standby_took_rank(rank: int, pid: object) -> str:
    """A replaced rank went to the warm standby worker."""
    return f"rank {rank}: the standby worker (pid {pid}) took over"


def standby_joined(pid: object) -> str:
    """A grow of an elastic group used the warm standby worker."""
    return f"the standby worker (pid {pid}) joined the group"


def standby_unusable(error: BaseException) -> str:
    """The standby worker failed its check before a hand-over."""
    return f"the standby worker is not usable ({error}); starting a new worker"


def elastic_started(started: int, most: int, min_workers: int) -> str:
    """An elastic group started with fewer than its maximum."""
    return (
        f"elastic group: started {started} of at most {most} worker(s) "
        f"(min_workers={min_workers}); the others did not fit"
    )


def removed_groups_of_dead_jobs(removed: object) -> str:
    """A new group's start removed placement groups Ray kept after their job ended."""
    return f"removed placement group(s) left by ended Ray job(s): {removed}"


def removed_leftover_groups(removed: object) -> str:
    """The pool removed placement groups left by its dead workers."""
    return f"removed placement group(s) left by dead worker(s): {removed}"
