"""Ray's resource names as a user sees them: the ones a user can ask for, readably.

Ray's resource tables also hold its own bookkeeping: a resource per placement group
and bundle (``CPU_group_<pg id>``, ``bundle_group_0_<pg id>``, ...), one per node
(``node:<ip>``) and the node's accelerator model (``accelerator_type:<model>``).
Console lines name only what a user can request: CPU, GPU, memory and custom resources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PLACEMENT_GROUP_RESOURCE = re.compile(r".+_group_(\d+_)?[0-9a-f]{16,}")
_NOT_ASKED_FOR = ("accelerator_type:",)
_NOT_ASKED_FOR_NAMES = frozenset({"object_store_memory"})
_FIRST = ("CPU", "GPU", "memory")
_BYTES = frozenset({"memory", "object_store_memory"})
_GIB = float(2**30)
_MIB = float(2**20)


def is_bookkeeping_resource(name: str) -> bool:
    """True for Ray's per-node (``node:<ip>``) and placement-group resources."""
    return name.startswith("node:") or _PLACEMENT_GROUP_RESOURCE.fullmatch(name) is not None


def user_resources(resources: Mapping[str, float]) -> dict[str, float]:
    """The entries of ``resources`` a user can ask for: CPU, GPU, memory, custom ones.

    Ray's placement-group resources (``*_group_*``), ``node:<ip>``,
    ``accelerator_type:*`` and ``object_store_memory`` are left out, so a message
    built from ``ray.available_resources()`` names only what ``resources_per_worker``
    (or a Tune trial's resources) can request.

    Example:
        >>> user_resources({"CPU": 2.0, "node:10.0.0.1": 1.0, "bundle_group_0_" + "ab" * 18: 999.999})
        {'CPU': 2.0}
    """
    return {
        k: float(v)
        for k, v in resources.items()
        if not is_bookkeeping_resource(k)
        and not k.startswith(_NOT_ASKED_FOR)
        and k not in _NOT_ASKED_FOR_NAMES
    }


def format_resources(resources: Mapping[str, float]) -> str:
    """``user_resources(resources)`` in one readable line: ``"CPU=2, GPU=1, memory=3.5GiB"``.

    CPU, GPU and memory come first, then custom resources by name. Amounts are rounded
    to two decimals (Ray's ``0.999`` reads ``1``); memory is shown in GiB (MiB below
    1 GiB). ``"none"`` when nothing is left.
    """
    kept = user_resources(resources)
    names = [k for k in _FIRST if k in kept] + sorted(k for k in kept if k not in _FIRST)
    return ", ".join(f"{k}={_amount(k, kept[k])}" for k in names) or "none"


def _amount(name: str, value: float) -> str:
    if name in _BYTES:
        if value >= _GIB:
            return f"{_number(value / _GIB)}GiB"
        return f"{_number(value / _MIB)}MiB"
    return _number(value)


def _number(value: float) -> str:
    rounded = round(value, 2)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.2f}".rstrip("0")
