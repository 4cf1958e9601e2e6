"""A run whose training thread stalls once, for test_hang_local.py (no Ray).

``python hang_local_script.py STORAGE NAME MARKER STALL_RANK [torchrun]``: four steps,
each a checkpoint; at step 2 of the first run (``MARKER`` missing) rank ``STALL_RANK``
creates the marker and sleeps for an hour before the step's all-reduce (under
torchrun; alone there is none). Run alone (``num_workers=0``) or by ``torchrun``.
Prints ``RESULT <json>`` with the metrics ``fit()`` returned.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from lumos import train


def loop(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "step.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, 4):
        if step == 2 and rank == config["stall_rank"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            time.sleep(3600)
        if dist.is_initialized():
            dist.all_reduce(torch.ones(1))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step.json"), "w") as f:
                json.dump({"step": step}, f)
            train.report(
                {"step": step, "start": start},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step={step}",
            )


if __name__ == "__main__":
    storage, name, marker, stall_rank = sys.argv[1:5]
    result = train.DataParallelTrainer(
        loop,
        train_loop_config={"marker": marker, "stall_rank": int(stall_rank)},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(
            name=name,
            storage_path=storage,
            failure_config=train.FailureConfig(hang_timeout_s=2.0),
        ),
    ).fit()
    print("RESULT " + json.dumps(result.metrics), flush=True)
