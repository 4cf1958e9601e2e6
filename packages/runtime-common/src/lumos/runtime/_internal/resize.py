"""Elastic groups: the result of a resize and the cluster's free resources (read from Ray)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from lumos.runtime._internal.policies import FreeResources
from lumos.runtime._internal.preemption import draining_nodes

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
        node: {
            k: float(v) for k, v in res.items() if not k.startswith("node:") and "_group_" not in k
        }
        for node, res in per_node.items()
        if node not in draining
    }
    return FreeResources(free, draining)
