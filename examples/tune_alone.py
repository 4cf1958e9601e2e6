"""lumos.tune alone: TPE + successive halving (ASHA) on a synthetic learning curve.

No training framework involved: each trial "trains" for up to 20 steps on a curve
whose floor depends on ``x`` and ``lr``, so the pruner has something to stop.

    python examples/tune_alone.py
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import optuna
import ray

from lumos import tune


def objective(config: dict[str, Any]) -> None:
    floor = (config["x"] - 2) ** 2 + abs(math.log10(config["lr"]) + 2)
    for step in range(1, 21):
        tune.report({"loss": floor + 10.0 / step})  # raises tune.TrialPruned when pruned


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    grid = tune.Tuner(
        objective,
        param_space={"x": tune.uniform(-5, 5), "lr": tune.loguniform(1e-4, 1e-1)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=30,
            max_concurrent_trials=2,
            sampler=optuna.samplers.TPESampler(seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=3),
        ),
        run_config=tune.RunConfig(
            storage_path=os.path.join(tempfile.gettempdir(), "lumos_examples")
        ),
    ).fit()
    best = grid.get_best_result()
    pruned = sum(r.status == "PRUNED" for r in grid)
    print(f"best config: {best.config}  loss={best.metrics['loss']:.3f}")
    print(f"{len(grid)} trials, {pruned} pruned, {grid.num_errors} errors")
    ray.shutdown()


if __name__ == "__main__":
    main()
