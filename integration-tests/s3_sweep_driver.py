"""Driver process of test_s3_resume: a Tune-over-Train sweep stored on S3 (moto).

Run as a subprocess so the test can SIGKILL it. It connects to the test session's
Ray cluster; Ray ends the actors of this job when the process dies.

    python s3_sweep_driver.py --address ADDR --endpoint URL --bucket B --name N --phase 1|2

Phase 1: trials after the first hold after step ``HOLD_AT`` (their checkpoint
committed) until stopped, so the test can kill the driver with a finished trial
and unfinished Train runs. Phase 2: nothing holds; the sweep resumes and finishes.
Prints one JSON line with the trials' outcome when the sweep ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")

STEPS = 5
HOLD_AT = 2
XS = [0.0, 1.0, 2.0, 3.0]

# Set from --phase before the trial function is shipped (cloudpickle takes it by value).
HOLD: bool = False


def trial(config: dict[str, Any]) -> None:
    import workloads

    from lumos import train
    from lumos.train.torch import TorchTrainer

    hold_at = HOLD_AT if HOLD and config["x"] > 0 else None
    TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"x": config["x"], "steps": STEPS, "hold_at": hold_at},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def main() -> int:
    global HOLD
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--phase", type=int, choices=[1, 2], required=True)
    args = parser.parse_args()
    HOLD = args.phase == 1

    import optuna
    import ray

    from lumos import tune
    from lumos.storage.testing import s3_filesystem

    ray.init(
        address=args.address,
        job_config=ray.job_config.JobConfig(code_search_path=[HERE, EXAMPLES]),
        log_to_driver=False,
    )
    grid = tune.Tuner(
        trial,
        param_space={"x": tune.uniform(0.0, 3.0)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=len(XS),
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            points_to_evaluate=[{"x": x} for x in XS],
            sampler=optuna.samplers.TPESampler(seed=0),
        ),
        run_config=tune.RunConfig(
            name=args.name,
            storage_path=f"s3://{args.bucket}/sweeps",
            storage_filesystem=s3_filesystem(args.endpoint),
            verbose=0,
        ),
    ).fit()
    print(
        json.dumps(
            [
                {
                    "trial": r.trial_name,
                    "x": r.config["x"],
                    "status": r.status,
                    "metrics": r.metrics,
                }
                for r in grid
            ]
        ),
        flush=True,
    )
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
