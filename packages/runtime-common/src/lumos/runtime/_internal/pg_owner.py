"""Placement groups named after the actor that created them, and their cleanup.

Ray scopes a placement group to the job, not to the actor that created it: when an
actor that started a ``WorkerGroup`` dies, Ray kills the group's worker actors (owned
by the dead actor) but keeps the placement group. Every ``WorkerGroup`` therefore
names its placement group ``lumos-wg-<creator actor id or 'driver'>-<uuid>``, and the
owner of the creator (``WorkerPool``) removes them when the creator dies or is removed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

import ray

from lumos.runtime._internal import messages

logger = logging.getLogger("lumos.runtime")

PG_NAME_PREFIX = "lumos-wg-"


def creator_actor_id() -> str | None:
    """Hex id of the actor this code runs in (``None`` in a driver)."""
    try:
        actor_id = ray.get_runtime_context().get_actor_id()
    except Exception:
        return None
    return actor_id or None


def placement_group_name(creator: str | None) -> str:
    """A unique placement group name carrying the creator's actor id."""
    return f"{PG_NAME_PREFIX}{creator or 'driver'}-{uuid.uuid4().hex}"


def actor_id_of(handle: Any) -> str | None:
    """Hex id of a Ray actor handle (``None`` when it has none)."""
    try:
        return str(handle._actor_id.hex())
    except Exception:
        return None


def remove_placement_groups_of(actor_ids: Iterable[str | None]) -> list[str]:
    """Remove every live placement group created by one of ``actor_ids``.

    Args:
        actor_ids: Hex actor ids (``None`` entries are ignored).

    Returns:
        The names of the placement groups removed.
    """
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    prefixes = tuple(f"{PG_NAME_PREFIX}{a}-" for a in actor_ids if a)
    if not prefixes or not ray.is_initialized():
        return []
    try:
        table = ray.util.placement_group_table()
    except Exception:
        logger.debug("placement_group_table failed", exc_info=True)
        return []
    removed: list[str] = []
    for pg_id, info in table.items():
        name = str(info.get("name") or "")
        if not name.startswith(prefixes) or info.get("state") == "REMOVED":
            continue
        try:
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
        except Exception:
            logger.debug("remove_placement_group(%s) failed", name, exc_info=True)
            continue
        removed.append(name)
    if removed:
        logger.info("%s", messages.removed_leftover_groups(removed))
    return removed
