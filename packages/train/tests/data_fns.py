"""Training functions and helpers of the data-input tests (shipped to workers by value)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from lumos import train


def loader_loop(config: dict[str, Any]) -> None:
    """Train over a shuffled DataLoader; log every batch a rank sees; checkpoint every k steps.

    Each rank appends ``{"step", "epoch", "ids", "attempt"}`` to ``out/rank{r}.jsonl``.
    Only rank 0 passes a checkpoint (the other ranks' loader positions travel with the
    report). ``die``: on attempt 0, rank ``die["rank"]`` SIGKILLs itself (or raises)
    right after it logged step ``die["step"]``.
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lumos.train.torch import prepare_data_loader

    torch.manual_seed(config.get("seed", 0))
    data = TensorDataset(torch.arange(config["n"]))
    loader = prepare_data_loader(DataLoader(data, batch_size=config["batch"], shuffle=True))
    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    step, start_epoch = 0, 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            saved = json.loads(Path(d, "state.json").read_text())
        step, start_epoch = saved["step"], saved["epoch"]
    mode = train.CheckpointUploadMode[config.get("mode", "SYNC")]
    log = Path(config["out"], f"rank{rank}.jsonl")
    die = config.get("die")
    for epoch in range(start_epoch, config["epochs"]):
        for (ids,) in loader:
            line = {"step": step, "epoch": epoch, "ids": ids.tolist(), "attempt": attempt}
            with log.open("a") as f:
                f.write(json.dumps(line) + "\n")
            step += 1
            if die and attempt == 0 and rank == die["rank"] and step == die["step"]:
                if die.get("how") == "raise":
                    raise RuntimeError("injected failure")
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(config.get("pace_s", 0.0))  # lets a driver kill land mid-run
            if step % config["every"]:
                train.report({"step": step})
                continue
            checkpoint = None
            if rank == 0:
                d = tempfile.mkdtemp()
                Path(d, "state.json").write_text(json.dumps({"step": step, "epoch": epoch}))
                checkpoint = train.Checkpoint.from_directory(d)
            train.report(
                {"step": step},
                checkpoint=checkpoint,
                checkpoint_dir_name=f"step={step}",
                checkpoint_upload_mode=mode,
            )


def batches_by_step(log: Path) -> list[list[int]]:
    """The batch a rank trained on at each step, checking that every replay repeats it.

    A resumed attempt replays the steps after its checkpoint; each replayed step must
    see the very batch the failed attempt saw at that step.
    """
    by_step: dict[int, list[int]] = {}
    for raw in log.read_text().splitlines():
        line = json.loads(raw)
        seen = by_step.setdefault(line["step"], line["ids"])
        assert seen == line["ids"], f"step {line['step']}: replayed {line['ids']}, first {seen}"
    assert sorted(by_step) == list(range(len(by_step))), f"steps skipped: {sorted(by_step)}"
    return [by_step[s] for s in range(len(by_step))]


def shard_rows(config: dict[str, Any]) -> None:
    """Write the ids of every row of each dataset shard, per epoch, to ``out/rank{r}.json``."""
    rank = train.get_context().get_world_rank()
    seen: dict[str, list[list[int]]] = {}
    for name in config["names"]:
        shard = train.get_dataset_shard(name)
        seen[name] = [
            [int(i) for batch in shard.iter_torch_batches(batch_size=7) for i in batch["id"]]
            for _ in range(config.get("epochs", 1))
        ]
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(seen))
    train.report({"done": 1})
