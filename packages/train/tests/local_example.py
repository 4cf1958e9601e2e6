"""The README's example in local mode (``num_workers=0``), for test_local_mode.py.

Imported by the in-process tests, and run as a script by ``torchrun`` (one process per
rank): ``python -m torch.distributed.run --nproc-per-node=2 local_example.py STORAGE
NAME [CRASH_MARKER]``. With a crash marker path, the last rank of the first run to
reach epoch 2 creates the marker and raises there, so that the next run of the same
command must resume from the run's latest checkpoint (job-level restore).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import torch

from lumos import train
from lumos.train.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_fn_per_worker(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    model = prepare_model(net)  # device + DDP (net stays the plain module)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = prepare_data_loader(  # DistributedSampler + device
        torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    )
    ctx = train.get_context()
    start = 0
    ckpt = train.get_checkpoint()  # latest committed checkpoint or None
    if ckpt:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
            net.load_state_dict(state["model"])
            start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        marker = config.get("crash_marker")
        if marker and epoch == 2 and not os.path.exists(marker):
            if ctx.get_world_rank() == ctx.get_world_size() - 1:
                open(marker, "w").close()
                raise RuntimeError("injected crash at epoch 2")
        loss = torch.zeros(())
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with tempfile.TemporaryDirectory() as d:
            if ctx.get_world_rank() == 0:
                torch.save({"model": net.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
            # every rank leaves a shard: the files of all ranks merge in the checkpoint
            with open(os.path.join(d, f"rank{ctx.get_world_rank()}.json"), "w") as f:
                json.dump({"epoch": epoch, "world": ctx.get_world_size()}, f)
            train.report(
                {"epoch": epoch, "loss": loss.item(), "world": ctx.get_world_size()},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"epoch={epoch}",
            )


def fit(storage: str, name: str, epochs: int = 4, crash_marker: str | None = None) -> train.Result:
    return TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"lr": 0.01, "epochs": epochs, "crash_marker": crash_marker},
        scaling_config=train.ScalingConfig(num_workers=0),  # local mode
        run_config=train.RunConfig(
            name=name,
            storage_path=storage,
            checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        ),
    ).fit()


if __name__ == "__main__":
    result = fit(sys.argv[1], sys.argv[2], crash_marker=sys.argv[3] if len(sys.argv) > 3 else None)
    rank = os.environ.get("RANK", "0")
    out = {
        "rank": int(rank),
        "metrics": result.metrics,
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        "best": [c.path for c, _ in result.best_checkpoints],
        "dist_initialized": torch.distributed.is_initialized(),
    }
    with open(os.path.join(sys.argv[1], f"result-rank{rank}.json"), "w") as f:
        json.dump(out, f)
