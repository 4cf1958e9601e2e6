"""``health_fns.loop`` under torchrun with validations and a NaN health check.

Run by test_local_mode.py: ``python -m torch.distributed.run --nproc-per-node=2
torchrun_health.py STORAGE NAME``. Each rank writes what its ``fit()`` returned to
``STORAGE/health-rank{r}.json``.
"""

from __future__ import annotations

import json
import os
import sys

import health_fns

from lumos import train

if __name__ == "__main__":
    storage, name = sys.argv[1], sys.argv[2]
    result = train.DataParallelTrainer(
        health_fns.loop,
        train_loop_config={
            "steps": 6,
            "nan_at": 4,
            "validate": True,
            "log": os.path.join(storage, "log.jsonl"),
        },
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(
            name=name, storage_path=storage, health_checks=[train.NonFiniteMetric("loss")]
        ),
        validation_config=train.ValidationConfig(health_fns.validate),
    ).fit()
    out = {"metrics": result.metrics, "best": [c.path for c, _ in result.best_checkpoints]}
    with open(os.path.join(storage, f"health-rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(out, f)
