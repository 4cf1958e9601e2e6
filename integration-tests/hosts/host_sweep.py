"""A Tune-over-Train sweep driver on a host of the harness, stored on the S3 host.

    python host_sweep.py CONFIG_JSON     prints RESULT [{"trial", "x", "status", "metrics"}]

``CONFIG_JSON``: ``address``, ``endpoint``, ``bucket``, ``name``, ``xs`` (the trials'
``x`` in order), ``progress`` and ``until`` (files, see ``host_workloads.sweep_steps``),
``phase`` (written into each progress row), ``steps`` (each Train run's minimum steps).
Each trial is a 2-worker ``TorchTrainer`` run (SPREAD: its ranks on two hosts); an
Optuna ``ThresholdPruner(upper=1.0)`` on ``loss`` prunes a trial with ``x >= 2`` at
its first report. Re-running the script with the same name resumes the sweep.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG: dict[str, Any] = {}  # set in main(), before the trial function is shipped


def trial(config: dict[str, Any]) -> None:
    import host_workloads

    from lumos import train
    from lumos.train.torch import TorchTrainer

    TorchTrainer(
        host_workloads.sweep_steps,
        train_loop_config={
            "x": config["x"],
            "steps": int(CONFIG.get("steps", 3)),
            "until": CONFIG["until"],
            "progress": CONFIG["progress"],
            "phase": CONFIG.get("phase"),
        },
        scaling_config=train.ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def sweep(xs: list[float]) -> Any:
    """The sweep (resumed when it exists)."""
    import optuna

    from lumos import tune
    from lumos.storage.testing import s3_filesystem

    return tune.Tuner(
        trial,
        param_space={"x": tune.uniform(0.0, 10.0)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=len(xs),
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            points_to_evaluate=[{"x": x} for x in xs],
            pruner=optuna.pruners.ThresholdPruner(upper=1.0),
        ),
        run_config=tune.RunConfig(
            name=CONFIG["name"],
            storage_path=f"s3://{CONFIG['bucket']}/sweeps",
            storage_filesystem=s3_filesystem(CONFIG["endpoint"]),
            verbose=0,
        ),
    ).fit()


def main() -> int:
    CONFIG.update(json.loads(sys.argv[1]))
    import ray

    ray.init(
        address=CONFIG["address"], job_config=ray.job_config.JobConfig(code_search_path=[HERE])
    )
    try:
        grid = sweep(CONFIG["xs"])
    except Exception as exc:  # the test asserts on it (a lease still held)
        import traceback

        traceback.print_exc()
        out: Any = {
            "raised": type(exc).__name__,
            "expires_in_s": getattr(exc, "expires_in_s", None),
        }
    else:
        out = [
            {"trial": r.trial_name, "x": r.config["x"], "status": r.status, "metrics": r.metrics}
            for r in grid
        ]
    print("RESULT " + json.dumps(out, default=repr), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
