"""Training functions the integration tests run on Train workers.

Workers import this module by name (the conftest puts this folder on the Ray
job's code search path), so it stays free of pytest and of test state.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from lumos import train

STEP_FILE = "step.json"


def _all_placements() -> list[list[Any]]:
    """``[world_rank, node_rank, node_id]`` of every rank (a collective: all ranks call it)."""
    ctx = train.get_context()
    mine = [ctx.get_world_rank(), ctx.get_node_rank(), ctx.get_worker_info().node_id]
    gathered: list[Any] = [None] * ctx.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [list(p) for p in gathered]


def _hold_until_stopped(timeout_s: float) -> None:
    """Block this attempt until the driver stops it (a node loss, a pruned or killed trial).

    Waits on the worker session's stop event: no polling, and the wait ends the
    moment the controller asks this rank to stop.
    """
    from lumos.runtime import worker

    session = worker.get_session()
    assert session is not None
    if not session.stop_event.wait(timeout_s):
        raise TimeoutError(f"nothing stopped this attempt within {timeout_s:.0f} s")
    session.raise_if_stop_requested()


def placements(config: dict[str, Any]) -> None:
    """Report where every rank runs (rank 0 reports the gathered list)."""
    train.report({"placements": _all_placements()})


def report_steps(config: dict[str, Any]) -> None:
    """Report ``config["loss"]`` every step for up to ``max_steps`` steps of ``step_s`` each.

    A step is one all-reduce, one report and ``step_s`` of simulated compute (a wait
    on the worker's stop event, so the machine stays usable and a stop is seen at
    once). A trial with a loss the pruner rejects must be stopped long before
    ``max_steps``: its next ``train.report`` raises.
    """
    from lumos.runtime import worker

    session = worker.get_session()
    assert session is not None
    step_s = float(config.get("step_s", 0.05))
    for step in range(1, int(config["max_steps"]) + 1):
        total = torch.ones(1)
        dist.all_reduce(total)
        train.report({"loss": float(config["loss"]), "step": step})
        session.stop_event.wait(step_s)


def fsdp_steps(config: dict[str, Any]) -> None:
    """:func:`report_steps` on a tiny model sharded by FSDP2: each step trains it and
    reports ``config["loss"]`` with a sharded DCP checkpoint ``step=<n>``, saved
    asynchronously (DCP's thread) and uploaded ASYNC, so a stop meets saves in flight."""
    from lumos.runtime import worker
    from lumos.train.torch import prepare_model, save_sharded_state

    session = worker.get_session()
    assert session is not None
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)]
    model = prepare_model(torch.nn.Sequential(*layers), parallel_strategy="fsdp")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(1, int(config["max_steps"]) + 1):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt = save_sharded_state(tempfile.mkdtemp(), model, opt, extra_state={"step": step},
                                  async_save=True, async_checkpointer_type="thread")  # fmt: skip
        train.report({"loss": float(config["loss"]), "step": step}, checkpoint=ckpt,
                     checkpoint_dir_name=f"step={step}",
                     checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)  # fmt: skip
        session.stop_event.wait(float(config.get("step_s", 0.05)))


def steps_with_checkpoints(config: dict[str, Any]) -> None:
    """``config["steps"]`` steps, a committed checkpoint ``step=<n>`` after each.

    Reports ``step``, ``resumed_from`` (the checkpoint's step this attempt started
    from, 0 when fresh), ``attempt``, ``loss`` and, with ``config["gather"]``, the
    node of every rank. With ``config["hold_at"]`` the first attempt stops after
    that step's checkpoint until the driver stops it; with ``config["crash_at"]``
    rank 1's process exits there in the first attempt (a worker failure).
    """
    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, STEP_FILE)) as f:
            start = int(json.load(f)["step"])
    hold_at = config.get("hold_at")
    x = float(config.get("x", 0.0))
    for step in range(start + 1, int(config["steps"]) + 1):
        total = torch.ones(1)
        dist.all_reduce(total)  # every rank is alive and in the group
        metrics: dict[str, Any] = {
            "step": step,
            "resumed_from": start,
            "attempt": ctx.get_attempt(),
            "world_size": int(total.item()),
            "loss": (x - 1.5) ** 2 + 1.0 / step,
        }
        if config.get("gather"):
            metrics["placements"] = _all_placements()
        with tempfile.TemporaryDirectory() as d:
            if ctx.get_world_rank() == 0:
                with open(os.path.join(d, STEP_FILE), "w") as f:
                    json.dump({"step": step}, f)
            train.report(
                metrics,
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step={step}",
            )
        if ctx.get_attempt() == 0:
            if step == config.get("crash_at") and ctx.get_world_rank() == 1:
                os._exit(1)  # the worker process dies, as on an OOM kill
            if step == hold_at:
                _hold_until_stopped(float(config.get("hold_timeout_s", 240.0)))


def stall_once(config: dict[str, Any]) -> None:
    """All-reduce every step; rank 1 sleeps before step ``at``'s all-reduce in the first
    attempt only (``marker``: a file made when it stalls), so the hang watchdog fires."""
    rank = train.get_context().get_world_rank()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, STEP_FILE)) as f:
            start = int(json.load(f)["step"])
    for step in range(start + 1, int(config["steps"]) + 1):
        if rank == 1 and step == int(config["at"]) and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            time.sleep(3600)  # stuck outside any collective: the culprit
        total = torch.ones(1)
        dist.all_reduce(total)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, STEP_FILE), "w") as f:
                json.dump({"step": step}, f)
            train.report(
                {"step": step, "loss": 1.0 / step}, checkpoint=train.Checkpoint.from_directory(d)
            )
