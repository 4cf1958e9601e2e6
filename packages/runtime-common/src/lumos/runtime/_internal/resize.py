"""Elastic groups: the result of a resize, the group and the cluster's free resources as a
``ScalingPolicy`` sees them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lumos.runtime._internal.policies import FreeResources, GroupState
from lumos.runtime._internal.preemption import PreemptionInfo, draining_nodes
from lumos.runtime._internal.resources import is_bookkeeping_resource
from lumos.runtime._internal.spec import WorkerGroupSpec

logger = logging.getLogger("lumos.runtime")


@dataclass(frozen=True)
class ResizeResult:
    """What ``WorkerGroup.remove_workers`` / ``add_workers`` changed.

    Attributes:
        old_to_new: Every worker that stayed: its old world rank -> its new one. Its
            process (and what it imported) is the same.
        added: World ranks of the new workers.
        from_standby: Those of ``added`` that a warm standby worker took.
        removed: Old world ranks of the workers that left.
        world_size: The group's size now.
        elapsed_s: How long the resize took.
    """

    old_to_new: dict[int, int]
    added: list[int] = field(default_factory=list)
    from_standby: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    world_size: int = 0
    elapsed_s: float = 0.0

    @property
    def changed(self) -> bool:
        """True when a worker left or joined."""
        return bool(self.added or self.removed)


def group_state(
    spec: WorkerGroupSpec,
    num_workers: int,
    notice: PreemptionInfo | None,
    lost_ranks: list[int] | None = None,
) -> GroupState:
    """A group of ``num_workers`` as a ``ScalingPolicy`` sees it (``scaling_state``)."""
    return GroupState(
        num_workers=num_workers,
        min_workers=spec.min_workers or spec.num_workers,
        max_workers=spec.num_workers,
        resources_per_worker=dict(spec.resources_per_worker),
        preempted_ranks=tuple(notice.preempted_ranks) if notice is not None else (),
        lost_ranks=tuple(sorted(set(lost_ranks or ()))),
    )


def read_free_resources() -> FreeResources:
    """Free resources per alive node from Ray's GCS, draining nodes set apart.

    Per-node ``node:...`` markers and placement-group bundle resources are left out;
    a draining node counts in ``draining`` only (it accepts no new work). Returns an
    empty ``FreeResources`` when Ray cannot say.
    """
    try:
        import ray

        state = ray._private.state
        per_node: dict[str, dict[str, float]] = state.available_resources_per_node()  # type: ignore[no-untyped-call]
    except Exception:
        logger.debug("reading the free resources failed", exc_info=True)
        return FreeResources()
    draining = draining_nodes()
    free = {
        node: {k: float(v) for k, v in res.items() if not is_bookkeeping_resource(k)}
        for node, res in per_node.items()
        if node not in draining
    }
    return FreeResources(free, draining)
