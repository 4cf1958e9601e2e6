"""Training functions of the peer-recovery tests and benchmark (shipped to Ray workers by value)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any


class Position:
    """A loader position: the number of batches consumed (advanced on committed steps)."""

    def __init__(self) -> None:
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = int(state["consumed"])


def log(config: dict[str, Any], **event: Any) -> None:
    """One JSON line per event, written outside the system under test."""
    event["t"] = time.time()
    with open(Path(config["log_dir"]) / f"rank{event['rank']}.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def batch(step: int, shard: int) -> tuple[Any, Any]:
    """The batch of ``step`` on ``shard``: a pure function of both."""
    import torch

    g = torch.Generator().manual_seed(1000 * shard + step)
    x = torch.randn(8, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25


def _maybe_die(config: dict[str, Any], rank: int, step: int) -> None:
    kills = config.get("kills") or []
    for i, (kill_rank, kill_step) in enumerate(kills):
        marker = Path(config["log_dir"]) / f"killed-{i}"
        if rank == kill_rank and step >= kill_step and not marker.exists():
            marker.write_text(str(time.time()))
            log(config, rank=rank, event="sigkill", step=step)
            os.kill(os.getpid(), signal.SIGKILL)


def _maybe_stall(config: dict[str, Any], rank: int, step: int) -> None:
    """``config["stall"] = [rank, step, seconds]``: that rank's training thread sleeps
    once there (outside torchft and lumos: a stuck rank)."""
    stall = config.get("stall")
    marker = Path(config["log_dir"]) / "stalled"
    if stall and rank == stall[0] and step >= stall[1] and not marker.exists():
        marker.write_text(str(time.time()))
        log(config, rank=rank, event="stall", step=step)
        time.sleep(float(stall[2]))


def _report(config: dict[str, Any], rank: int, step: int, loss: float, model: Any) -> None:
    """Every rank reports; rank 0 saves a checkpoint every ``checkpoint_every`` steps."""
    import tempfile

    import torch

    from lumos import train

    every = config.get("checkpoint_every")
    if rank != 0 or not every or step % every:
        train.report({"step": step, "loss": loss})
        return
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), Path(d) / "model.pt")
        checkpoint = train.Checkpoint.from_directory(d)
        train.report({"step": step, "loss": loss}, checkpoint=checkpoint,
                     checkpoint_dir_name=f"step={step}")  # fmt: skip


def _load_as_documented(ft: Any, model: Any) -> None:
    """What the guide tells a user for the checkpoint fallback, on every rank: load
    ``train.get_checkpoint()`` (rank 0's ``step=N``) and call ``ft.resume_from(N)``."""
    import torch

    from lumos import train

    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        return
    with checkpoint.as_directory() as d:
        model.load_state_dict(torch.load(Path(d) / "model.pt", weights_only=True))
    ft.resume_from(int(Path(checkpoint.path).name.split("=")[1]))


def target_step(config: dict[str, Any]) -> int:
    """``config["steps"]``, or the step written into the ``config["until"]`` file once the
    test wrote it (every rank reads the same one, so all stop at the same step)."""
    until = config.get("until")
    if until:
        try:
            return int(Path(until).read_text())
        except (OSError, ValueError):
            pass
    return int(config["steps"])


def ft_train(config: dict[str, Any]) -> None:
    """Data-parallel training under TorchftConfig; kills ranks as ``config["kills"]`` says."""
    import torch

    from lumos import train
    from lumos.train.torch import prepare_torchft

    rank = train.get_context().get_world_rank()
    log(config, rank=rank, event="start", pid=os.getpid(), node=_node_id())
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    position = Position()
    ft = prepare_torchft(
        model, optimizer, state={"data": position},
        min_replica_size=int(config.get("min_replica_size", 1)),
    )  # fmt: skip
    if config.get("load_checkpoint"):
        _load_as_documented(ft, model)
    log(config, rank=rank, event="prepared", step=ft.step)
    said_recovered = False
    while ft.step < target_step(config):
        ft.optimizer.zero_grad()  # the quorum: a replacement takes its peer's state here
        if ft.recovered_at is not None and not said_recovered:
            said_recovered = True
            log(config, rank=rank, event="recovered", step=ft.step, position=position.consumed)
        step = ft.step
        x, y = batch(step, rank if config.get("per_rank_data") else 0)
        loss = torch.nn.functional.mse_loss(ft.model(x), y)
        loss.backward()
        time.sleep(config.get("step_s", 0.0))
        ft.optimizer.step()
        log(config, rank=rank, event="step", step=step, ok=ft.committed, n=ft.participants(),
            pid=os.getpid())  # fmt: skip
        if ft.committed:
            position.consumed += 1
            if ft.step % config.get("report_every", 10) == 0:
                _report(config, rank, ft.step, float(loss.detach()), model)
        _maybe_die(config, rank, ft.step)
        _maybe_stall(config, rank, ft.step)
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    log(config, rank=rank, event="done", step=ft.step, weights=weights, position=position.consumed)


def _node_id() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # not under Ray
        return None


def read_log(log_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's events, in order."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(log_dir).glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        out[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return out
