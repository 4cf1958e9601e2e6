"""Training function of the Ray Data resume tests (shipped to workers by value)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from lumos import train


def shard_loop(config: dict[str, Any]) -> None:
    """Train over ``get_dataset_shard("train")``; log every batch; checkpoint every k steps.

    Each rank appends ``{"step", "epoch", "ids", "attempt"}`` to ``out/rank{r}.jsonl``.
    Every rank passes checkpoint files (SYNC), so a report returns once its checkpoint
    committed. ``die``: on attempt 0, rank ``die["rank"]`` SIGKILLs itself right after
    it logged step ``die["step"]``.
    """
    shard = train.get_dataset_shard("train")
    ctx = train.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.get_attempt()
    step, start_epoch = 0, 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            saved = json.loads(Path(d, "state.json").read_text())
        step, start_epoch = saved["step"], saved["epoch"]
    log = Path(config["out"], f"rank{rank}.jsonl")
    die = config.get("die")
    for epoch in range(start_epoch, config["epochs"]):
        for batch in shard.iter_torch_batches(batch_size=config["batch"]):
            line = {"step": step, "epoch": epoch, "ids": batch["id"].tolist(), "attempt": attempt}
            with log.open("a") as f:
                f.write(json.dumps(line) + "\n")
            step += 1
            if die and attempt == 0 and rank == die["rank"] and step == die["step"]:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % config["every"]:
                train.report({"step": step})
                continue
            # every rank passes files: each SYNC report returns once its checkpoint committed
            d = tempfile.mkdtemp()
            state = json.dumps({"step": step, "epoch": epoch})
            Path(d, "state.json" if rank == 0 else f"rank{rank}.json").write_text(state)
            checkpoint = train.Checkpoint.from_directory(d)
            train.report({"step": step}, checkpoint=checkpoint, checkpoint_dir_name=f"step={step}")
