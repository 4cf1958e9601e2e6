"""Rank assignment from worker metadata (pure functions, unit tested without Ray)."""

from __future__ import annotations

from typing import Any

from lumos.runtime._internal.session import WorkerInfo


def assign_ranks(
    metas: list[dict[str, Any]], owner_node_id: str | None
) -> tuple[list[int], list[WorkerInfo]]:
    """Order workers so ranks on one node are contiguous.

    Nodes are ordered with the owner's node first, then by first appearance; workers
    keep their creation order within a node.

    Args:
        metas: Per created worker (creation order): ``node_id``, ``node_ip``, ``pid``, ``gpu_ids``.
        owner_node_id: Node of the process that owns the group.

    Returns:
        ``(order, infos)``: ``order[rank]`` is the creation index of the worker with
        that world rank, ``infos[rank]`` its WorkerInfo.
    """
    node_order: list[str] = []
    for m in metas:
        if m["node_id"] not in node_order:
            node_order.append(m["node_id"])
    if owner_node_id in node_order:
        node_order.remove(owner_node_id)
        node_order.insert(0, owner_node_id)
    node_rank = {n: i for i, n in enumerate(node_order)}
    order = sorted(range(len(metas)), key=lambda i: (node_rank[metas[i]["node_id"]], i))
    per_node: dict[str, int] = {}
    for m in metas:
        per_node[m["node_id"]] = per_node.get(m["node_id"], 0) + 1
    local_seen: dict[str, int] = {}
    infos: list[WorkerInfo] = []
    for rank, idx in enumerate(order):
        m = metas[idx]
        node = m["node_id"]
        local = local_seen.get(node, 0)
        local_seen[node] = local + 1
        infos.append(
            WorkerInfo(
                world_rank=rank,
                world_size=len(metas),
                local_rank=local,
                local_world_size=per_node[node],
                node_rank=node_rank[node],
                node_id=node,
                node_ip=str(m["node_ip"]),
                pid=int(m["pid"]),
                gpu_ids=list(m.get("gpu_ids", [])),
            )
        )
    return order, infos


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options for a worker needing ``resources``."""
    res = dict(resources)
    opts: dict[str, Any] = {"num_cpus": float(res.pop("CPU", 0.0))}
    gpus = float(res.pop("GPU", 0.0))
    if gpus:
        opts["num_gpus"] = gpus
    mem = res.pop("memory", None)
    if mem:
        opts["memory"] = mem
    if res:
        opts["resources"] = res
    return opts


def meta_of(info: WorkerInfo) -> dict[str, Any]:
    """The setup metadata of a worker that keeps running."""
    return {
        "node_id": info.node_id,
        "node_ip": info.node_ip,
        "pid": info.pid,
        "gpu_ids": info.gpu_ids,
    }


def infos_keep_ranks(metas: list[dict[str, Any]]) -> list[WorkerInfo]:
    """WorkerInfos for workers whose world rank is fixed (index of ``metas``).

    After some ranks were replaced, local ranks and node ranks are recomputed from
    where every worker now runs, but no world rank changes.
    """
    _, infos = assign_ranks(metas, None)
    by_pid = {(i.node_id, i.pid): i for i in infos}
    out: list[WorkerInfo] = []
    for rank, m in enumerate(metas):
        i = by_pid[(m["node_id"], int(m["pid"]))]
        out.append(
            WorkerInfo(
                world_rank=rank,
                world_size=len(metas),
                local_rank=i.local_rank,
                local_world_size=i.local_world_size,
                node_rank=i.node_rank,
                node_id=i.node_id,
                node_ip=i.node_ip,
                pid=i.pid,
                gpu_ids=list(i.gpu_ids),
            )
        )
    return out


def avoid_nodes_selector(
    avoid: tuple[str, ...], count: int, alive: list[str]
) -> list[dict[str, str]] | None:
    """A placement group's ``bundle_label_selector`` keeping ``count`` bundles off the
    ``avoid`` nodes, or ``None`` when there is nothing to avoid or no other alive node."""
    if not avoid or not [n for n in alive if n not in avoid]:
        return None
    return [{"ray.io/node-id": f"!in({','.join(sorted(avoid))})"} for _ in range(count)]
