"""Training functions the hosts scenarios run on Train workers (imported by name).

The drivers put this folder on the Ray job's code search path; the hosts share the
machine's filesystem, so every host's workers import the same file.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from lumos import train

SHARD = "shard-{rank}.json"


def _socket_fds() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                out.add(int(name))
        except OSError:
            continue
    return out


def _connected(fds: set[int]) -> list[list[str]]:
    """``[local "ip:port", peer "ip:port"]`` of the connected TCP sockets among ``fds``."""
    pairs = []
    for fd in sorted(fds):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM:
                continue
            local, peer = sock.getsockname(), sock.getpeername()
            pairs.append([f"{local[0]}:{local[1]}", f"{peer[0]}:{peer[1]}"])
        except OSError:
            pass  # a listening socket, or not TCP
        finally:
            sock.close()
    return pairs


def gloo_peers() -> list[list[str]]:
    """The TCP connections of a new gloo group (collective): its peers' addresses.

    A new group uses the same gloo device (interface, address) as the default group,
    so its full mesh of connections says where the default group's traffic goes.
    """
    before = _socket_fds()
    group = dist.new_group(backend="gloo")
    dist.barrier(group=group)
    pairs = _connected(_socket_fds() - before)
    dist.destroy_process_group(group)
    return pairs


def _start_step() -> int:
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as d:
        steps = {json.load(open(os.path.join(d, f)))["step"] for f in os.listdir(d)}
    assert len(steps) == 1, f"shards of different steps in one checkpoint: {steps}"
    return int(steps.pop())


def _whoami(ctx: Any) -> dict[str, Any]:
    info = ctx.get_worker_info()
    return {
        "rank": ctx.get_world_rank(),
        "node_ip": info.node_ip,
        "node_id": info.node_id,
        "pid": os.getpid(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "master_addr": os.environ.get("MASTER_ADDR"),
    }


def ddp_sharded(config: dict[str, Any]) -> None:
    """DDP steps of a linear model; every rank writes its shard of each checkpoint.

    Each rank's batch is all ``rank + 1``, so the averaged gradient of the weight is
    ``8 * mean(rank + 1)`` on every rank only if the ranks exchanged gradients.
    Rank 0 reports every rank's gradient, node and gloo connections. With
    ``hold_at`` the first attempt holds after that step's commit until stopped;
    ``step_s`` is a pause per step (for scenarios that act mid-run); with ``until`` (a
    file path) the run goes on past ``steps`` until that file exists.
    """
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    start = _start_step()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    me = dict(_whoami(ctx), peers=gloo_peers())
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, me)
    until = config.get("until")  # a file (the hosts share a filesystem): run until it exists
    step = start
    while step < int(config["steps"]) or (until is not None and not os.path.exists(until)):
        step += 1
        model.zero_grad()
        model(torch.full((8, 4), float(rank + 1))).sum().backward()
        grad = model.module.weight.grad
        assert grad is not None
        grads: list[Any] = [None] * world
        dist.all_gather_object(grads, grad.flatten().tolist())
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, SHARD.format(rank=rank)), "w") as f:
                shard = {"step": step, "rank": rank, "world": world, "attempt": ctx.get_attempt()}
                json.dump(dict(shard, node_ip=me["node_ip"], pid=me["pid"], time=time.time()), f)
            train.report(
                {
                    "step": step,
                    "world_size": world,
                    "attempt": ctx.get_attempt(),
                    "resumed_from": start,
                    "grads": grads,
                    "ranks": everyone,
                    "time": time.time(),
                },
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step={step}",
            )
        if ctx.get_attempt() == 0 and step == config.get("hold_at"):
            _hold(float(config.get("hold_timeout_s", 300.0)))
        _pause(float(config.get("step_s", 0.0)))


def _pause(seconds: float) -> None:
    if seconds <= 0:
        return
    from lumos.runtime import worker

    session = worker.get_session()
    assert session is not None
    session.stop_event.wait(seconds)
    session.raise_if_stop_requested()


def _hold(timeout_s: float) -> None:
    from lumos.runtime import worker

    session = worker.get_session()
    assert session is not None
    if not session.stop_event.wait(timeout_s):
        raise TimeoutError(f"nothing stopped this attempt within {timeout_s:.0f} s")
    session.raise_if_stop_requested()


def sweep_steps(config: dict[str, Any]) -> None:
    """A trial's Train run: ``loss = x * (1 + 1/step) / 2`` each step, a checkpoint each.

    Runs ``steps`` steps, then on until the ``until`` file exists. Rank 0 appends
    ``{x, step, attempt, resumed_from}`` to the ``progress`` file after each commit
    (the hosts share a filesystem: the test reads it to know when to kill the driver).
    """
    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(json.load(open(os.path.join(d, "step.json")))["step"])
    x, until = float(config["x"]), config.get("until")
    step = start
    while step < int(config["steps"]) or (until is not None and not os.path.exists(until)):
        step += 1
        total = torch.ones(1)
        dist.all_reduce(total)
        metrics = {"loss": x * (1 + 1 / step) / 2, "step": step, "resumed_from": start}
        with tempfile.TemporaryDirectory() as d:
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
        if ctx.get_world_rank() == 0:
            row = {"x": x, "step": step, "resumed_from": start, "phase": config.get("phase")}
            row["t"] = time.time()
            with open(config["progress"], "a") as f:
                f.write(json.dumps(row) + "\n")
        _pause(float(config.get("step_s", 0.2)))
