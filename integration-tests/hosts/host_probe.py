"""Ask the hosts' Ray cluster about its nodes, from a host (run in a namespace).

    python host_probe.py nodes ADDRESS                  RESULT [{"ip", "node_id", "cpus"}, ...]
    python host_probe.py drain ADDRESS IP DEADLINE_S    RESULT {"accepted", "why", "node_id"}

``nodes`` lists the alive nodes through the GCS (no driver is started). ``drain``
sends the GCS the preemption notice a cloud provider's spot reclaim sends
(``GcsClient.drain_node``, reason ``DRAIN_NODE_REASON_PREEMPTION``) for the node at
``IP``, with a deadline ``DEADLINE_S`` seconds from now.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _gcs(address: str) -> Any:
    import ray

    return ray._raylet.GcsClient(address=address)  # type: ignore[attr-defined]


def nodes(address: str) -> list[dict[str, Any]]:
    """The alive nodes: address, id and CPUs."""
    from ray.core.generated import gcs_pb2

    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    out = []
    for node_id, info in _gcs(address).get_all_node_info().items():
        if info.state == alive:
            cpus = float(dict(info.resources_total).get("CPU", 0.0))
            out.append({"ip": info.node_manager_address, "node_id": node_id.hex(), "cpus": cpus})
    return sorted(out, key=lambda n: n["ip"])


def drain(address: str, ip: str, deadline_s: float) -> dict[str, Any]:
    """A preemption notice for the node at ``ip``."""
    from ray.core.generated import autoscaler_pb2

    (node,) = [n for n in nodes(address) if n["ip"] == ip]
    accepted, why = _gcs(address).drain_node(
        node["node_id"],
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "spot instance reclaimed",
        int((time.time() + deadline_s) * 1000),
    )
    return {"accepted": bool(accepted), "why": str(why), "node_id": node["node_id"]}


def main() -> int:
    command, address, *rest = sys.argv[1:]
    if command == "nodes":
        out: Any = nodes(address)
    else:
        out = drain(address, rest[0], float(rest[1]))
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
