"""Training functions used by the tests (shipped to Ray workers by value)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from lumos import train


def _resume_step() -> int:
    ckpt = train.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        return int(json.load(f)["step"]) + 1


def _save(step: int, extra: dict[str, Any] | None = None) -> train.Checkpoint:
    d = tempfile.mkdtemp(prefix="lumos-test-ckpt-")
    rank = train.get_context().get_world_rank()
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"step": step, **(extra or {})}, f)
    with open(os.path.join(d, f"shard_{rank}.txt"), "w") as f:
        f.write(f"rank {rank} step {step}")
    return train.Checkpoint.from_directory(d)


def checkpointing_loop(config: dict[str, Any]) -> None:
    """Report ``steps`` checkpoints; resume from the latest one.

    Options: ``die`` = {"rank", "step", "how"} kills/fails that rank at that step in
    attempt 0 (``how``: sigkill | raise | hang); ``hold`` = {"step", "until"} makes every
    rank wait before that step until the file ``until`` exists (the test kills the run
    meanwhile; after 300 s it fails).
    """
    start = _resume_step()
    ctx = train.get_context()
    die = config.get("die")
    for step in range(start, config["steps"]):
        if (
            die
            and ctx.get_attempt() == 0
            and ctx.get_world_rank() == die["rank"]
            and step == die["step"]
        ):
            how = die.get("how", "sigkill")
            if how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "raise":
                raise ValueError(f"boom at step {step}")
            elif how == "hang":
                time.sleep(3600)
        if config.get("hold") and step == config["hold"]["step"]:
            wait_for_file(config["hold"]["until"])
        metrics = {"step": step, "start": start, "attempt": ctx.get_attempt()}
        if "losses" in config:
            metrics["loss"] = config["losses"][step]
        train.report(metrics, checkpoint=_save(step))


def wait_for_file(path: str, timeout_s: float = 300.0) -> None:
    """Wait (bounded) until another process creates ``path``."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):  # another process creates it: poll
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.02)


def metrics_only_loop(config: dict[str, Any]) -> None:
    """``n`` metrics-only reports on every rank."""
    for i in range(config["n"]):
        train.report({"i": i, "rank": train.get_context().get_world_rank()})


def mismatched_dir_names(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    train.report({"x": 1}, checkpoint=_save(0), checkpoint_dir_name=f"ckpt_rank{rank}")


def failing_loop(config: dict[str, Any]) -> None:
    train.report({"step": 0})
    if train.get_context().get_world_rank() == config.get("rank", 1):
        raise ValueError("bad batch on purpose")


def stopping_loop(config: dict[str, Any]) -> None:
    """Reports forever (bounded) until the controller stops it."""
    for i in range(100_000):
        train.report({"i": i})
        time.sleep(0.01)


def sharded_checkpoint(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, f"model_shard_{rank}.bin"), "wb") as f:
        f.write(bytes([rank]) * (1000 + rank))
    train.report(
        {"done": 1}, checkpoint=train.Checkpoint.from_directory(d), checkpoint_dir_name="sharded"
    )


def ddp_step(config: dict[str, Any]) -> None:
    """One or more SGD steps of a linear model on this rank's half of a fixed global batch."""
    import torch

    from lumos.train.torch import get_device, prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x = torch.tensor(config["x"], dtype=torch.float32)
    y = torch.tensor(config["y"], dtype=torch.float32)
    ctx = train.get_context()
    per = len(x) // ctx.get_world_size()
    lo = ctx.get_world_rank() * per
    xs, ys = x[lo : lo + per].to(get_device()), y[lo : lo + per].to(get_device())
    for _ in range(config["steps"]):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
    module = getattr(model, "module", model)
    train.report(
        {
            "weight": module.weight.detach().cpu().tolist(),
            "bias": module.bias.detach().cpu().tolist(),
            "rank": ctx.get_world_rank(),
        }
    )


def data_loader_epochs(config: dict[str, Any]) -> None:
    """Write the sample ids each rank sees per epoch to ``out/rank{r}.json``."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lumos.train.torch import prepare_data_loader

    data = TensorDataset(torch.arange(config["n"]))
    loader = prepare_data_loader(DataLoader(data, batch_size=2, shuffle=config["shuffle"]))
    seen = []
    for _ in range(2):
        seen.append([int(i) for (batch,) in loader for i in batch])
    rank = train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump({"seen": seen, "len": len(loader)}, f)
    train.report({"done": 1})


def torch_barrier_loop(config: dict[str, Any]) -> None:
    """Checkpointing loop with a gloo barrier per step; rank 1 raises at step 3 (attempt 0),
    while rank 0 is blocked in that step's barrier."""
    import torch.distributed as dist

    start = _resume_step()
    ctx = train.get_context()
    for step in range(start, config["steps"]):
        if ctx.get_attempt() == 0 and ctx.get_world_rank() == 1 and step == 3:
            raise ValueError("rank 1 fails while rank 0 waits in a collective")
        dist.barrier()
        train.report({"step": step, "start": start}, checkpoint=_save(step))


def uneven_checkpoints(config: dict[str, Any]) -> None:
    """Rank 1 returns at once; rank 0 then reports a checkpoint nobody else will.

    In-process only: rank 1 sets ``EVENTS[config["key"]]`` as it returns, rank 0 waits
    for it before reporting.
    """
    returned = EVENTS[config["key"]]
    if train.get_context().get_world_rank() == 1:
        returned.set()
        return
    if not returned.wait(60):
        raise TimeoutError("rank 1 never returned")
    train.report({"x": 1}, checkpoint=_save(0))


class _SignalAfterUpload(train.Checkpoint):
    """A local checkpoint that sets ``event`` once train.report() has persisted it."""

    def __init__(self, path: str, event: threading.Event) -> None:
        super().__init__(path)
        self._event = event

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        with super().as_directory() as d:
            yield d
        self._event.set()


# In-process events for the fake worker group's threads (configs must pickle).
EVENTS: dict[str, threading.Event] = {}


def upload_then_end(config: dict[str, Any]) -> None:
    """Two committed checkpoints; then rank 0 uploads ``checkpoint_2`` and waits for its
    commit while rank 1, once that upload is on storage, ends the run without reporting it.

    In-process only (fake worker group): ``EVENTS[config["key"] + ":uploaded"]`` is set
    after the upload; ``config["then"]`` is ``"raise"`` (rank 1 fails) or ``"stop"``
    (rank 1 sets the parent job's stop event ``EVENTS[key + ":stop"]`` and waits to be
    stopped).
    """
    from lumos.runtime import worker

    for step in range(2):
        train.report({"step": step}, checkpoint=_save(step))
    uploaded = EVENTS[config["key"] + ":uploaded"]
    if train.get_context().get_world_rank() == 0:
        ckpt = _save(2)
        train.report({"step": 2}, checkpoint=_SignalAfterUpload(ckpt.path, uploaded))
        return
    if not uploaded.wait(60):
        raise TimeoutError("rank 0 never uploaded checkpoint_2")
    if config["then"] == "raise":
        raise ValueError("rank 1 fails while rank 0's checkpoint is not committed")
    EVENTS[config["key"] + ":stop"].set()
    session = worker.get_session()
    if session is None:
        raise RuntimeError("upload_then_end runs only in a lumos worker")
    session.stop_event.wait(60)
    train.report({"step": 2})  # raises StopRequested: the controller stopped this worker
