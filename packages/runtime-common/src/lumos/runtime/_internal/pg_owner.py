"""Placement groups named after the actor that created them, and their cleanup.

Ray scopes a placement group to the job, not to the actor that created it: when an
actor that started a ``WorkerGroup`` dies, Ray kills the group's worker actors (owned
by the dead actor) but keeps the placement group. Every ``WorkerGroup`` therefore
names its placement group ``lumos-wg-<creator actor id or 'driver'>-<uuid>``, and the
owner of the creator (``WorkerPool``) removes them when the creator dies or is removed.

When the driver itself dies, Ray removes its job's groups, but an actor of that job that
is still running for a moment (a trial restarting its workers, which the job's death just
killed) can create a group after that removal, and Ray then keeps it for good. So every
``WorkerGroup.start`` first removes the lumos groups of jobs that are dead
(``remove_groups_of_dead_jobs``): a restarted driver cleans up what its killed
predecessor's actors left.
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


def _live_table() -> dict[str, Any]:
    """The cluster's placement groups that are not REMOVED, by hex id ({} on failure)."""
    try:
        table = ray.util.placement_group_table()
    except Exception:
        logger.debug("placement_group_table failed", exc_info=True)
        return {}
    return {k: v for k, v in table.items() if v.get("state") != "REMOVED"}


def _remove(pg_id: str, name: str) -> bool:
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    try:
        remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
    except Exception:
        logger.debug("remove_placement_group(%s) failed", name, exc_info=True)
        return False
    return True


def job_of(pg_id: str) -> str:
    """Hex id of the job a placement group belongs to (its id's last 4 bytes)."""
    return pg_id[-8:]


def remove_groups_of_dead_jobs() -> list[str]:
    """Remove every live lumos placement group whose job has ended.

    Ray ties a (non-detached) placement group to its job; this removes the ones Ray
    missed (see the module docstring). Groups of live jobs, and groups not named by
    lumos, are left alone.

    Returns:
        The names of the placement groups removed.
    """
    if not ray.is_initialized():
        return []
    live = {
        k: v
        for k, v in _live_table().items()
        if str(v.get("name") or "").startswith(PG_NAME_PREFIX)
    }
    if not live:
        return []
    try:
        from ray._private.state import jobs

        table = jobs()  # type: ignore[no-untyped-call]
        dead = {str(j["JobID"]) for j in table if j.get("IsDead")}
    except Exception:
        logger.debug("the job table could not be read", exc_info=True)
        return []
    removed = [
        str(info["name"])
        for pg_id, info in live.items()
        if job_of(pg_id) in dead and _remove(pg_id, str(info["name"]))
    ]
    if removed:
        logger.info("%s", messages.removed_groups_of_dead_jobs(removed))
    return removed


def remove_placement_groups_of(actor_ids: Iterable[str | None]) -> list[str]:
    """Remove every live placement group created by one of ``actor_ids``.

    Args:
        actor_ids: Hex actor ids (``None`` entries are ignored).

    Returns:
        The names of the placement groups removed.
    """
    prefixes = tuple(f"{PG_NAME_PREFIX}{a}-" for a in actor_ids if a)
    if not prefixes or not ray.is_initialized():
        return []
    removed = [
        str(info["name"])
        for pg_id, info in _live_table().items()
        if str(info.get("name") or "").startswith(prefixes) and _remove(pg_id, str(info["name"]))
    ]
    if removed:
        logger.info("%s", messages.removed_leftover_groups(removed))
    return removed
