"""Population-based training: wall time against FIFO on the same trials, lumos and ray.tune.

The population of the issue: 4 trials x 12 steps of 0.5 s, 2 trials at a time, a
perturbation every 2 steps, a checkpoint every step. Each library runs the same trials
once with PBT and once without a scheduler (FIFO), on the same Ray cluster, and the
ratio PBT / FIFO is printed. Budget (DESIGN.md): lumos's PBT at most 1.2x its own
FIFO (Ray 2.58 measured 2-2.7x its FIFO).

Run: ``.venv/bin/python benchmarks/bench_tune.py --pbt`` (``--quick``: 6 steps of 0.25 s),
or this file directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import optuna
import ray
from ray import cloudpickle

# The trial functions are shipped by value: Ray's workers cannot import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TRIALS = 4
CONCURRENCY = 2
INTERVAL = 2


def _step_state(get_checkpoint: Any) -> tuple[float, int]:
    if (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "s.json")) as f:
            x, step = json.load(f)
            return float(x), int(step)
    return 0.0, 0


def make_objective(lib: str, steps: int, step_s: float) -> Any:
    """The trial function for ``lib`` ("lumos" or "ray")."""

    def objective(config: dict[str, Any]) -> None:
        if lib == "lumos":
            from lumos import tune as t
        else:
            from ray import tune as t  # type: ignore[no-redef]
        x, step = _step_state(t.get_checkpoint)
        while step < steps:
            step += 1
            x += 1.0 / (1.0 + abs(config["lr"] - 0.1))
            time.sleep(step_s)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "s.json"), "w") as f:
                    json.dump([x, step], f)
                t.report({"score": x}, checkpoint=t.Checkpoint.from_directory(d))

    return objective


def lumos_run(storage: str, name: str, steps: int, step_s: float, pbt: bool) -> tuple[float, int]:
    from lumos import tune

    scheduler = None
    if pbt:
        scheduler = tune.PopulationBasedTraining(
            perturbation_interval=INTERVAL,
            hyperparam_mutations={"lr": tune.loguniform(1e-4, 1.0)},
            seed=0,
        )
    t0 = time.perf_counter()
    grid = tune.Tuner(
        make_objective("lumos", steps, step_s),
        param_space={"lr": tune.loguniform(1e-4, 1.0)},
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            num_samples=TRIALS,
            max_concurrent_trials=CONCURRENCY,
            sampler=optuna.samplers.RandomSampler(seed=0),
            scheduler=scheduler,
        ),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()
    elapsed = time.perf_counter() - t0
    assert grid.num_terminated == TRIALS, grid
    return elapsed, sum(len(r.exploits) for r in grid)


def ray_run(storage: str, name: str, steps: int, step_s: float, pbt: bool) -> float | None:
    try:
        from ray import tune as ray_tune
        from ray.tune.schedulers import PopulationBasedTraining
    except ImportError as exc:
        print(f"ray.tune unavailable ({exc})")
        return None
    scheduler = None
    if pbt:
        scheduler = PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=INTERVAL,
            hyperparam_mutations={"lr": ray_tune.loguniform(1e-4, 1.0)},
        )
    t0 = time.perf_counter()
    results = ray_tune.Tuner(
        make_objective("ray", steps, step_s),
        param_space={"lr": ray_tune.loguniform(1e-4, 1.0)},
        tune_config=ray_tune.TuneConfig(
            metric="score",
            mode="max",
            num_samples=TRIALS,
            max_concurrent_trials=CONCURRENCY,
            scheduler=scheduler,
        ),
        run_config=ray_tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()
    elapsed = time.perf_counter() - t0
    assert len(results) == TRIALS
    return elapsed


def run(quick: bool) -> dict[str, Any]:
    """Run the four sweeps (Ray must be initialised) and print the ratios."""
    steps, step_s = (6, 0.25) if quick else (12, 0.5)
    with tempfile.TemporaryDirectory(prefix="bench-pbt-") as storage:
        lumos_run(storage, "warmup", 1, 0.0, pbt=False)  # actor start-up, imports
        fifo, _ = lumos_run(storage, "lumos-fifo", steps, step_s, pbt=False)
        pbt, exploits = lumos_run(storage, "lumos-pbt", steps, step_s, pbt=True)
        ray_fifo = ray_run(storage, "ray-fifo", steps, step_s, pbt=False)
        ray_pbt = ray_run(storage, "ray-pbt", steps, step_s, pbt=True)
    print()
    print(
        f"PBT: {TRIALS} trials x {steps} steps of {step_s} s, {CONCURRENCY} at a time, "
        f"perturbation every {INTERVAL} steps"
    )
    ratio = pbt / fifo
    print(f"  lumos FIFO {fifo:6.1f} s   lumos PBT {pbt:6.1f} s   ({exploits} exploits)")
    print(
        f"  lumos PBT / lumos FIFO = {ratio:5.2f}x  (budget <= 1.2x)  "
        f"{'OK' if ratio <= 1.2 else 'OVER BUDGET'}"
    )
    out: dict[str, Any] = {"lumos_fifo_s": fifo, "lumos_pbt_s": pbt, "ratio": ratio}
    if ray_fifo is not None and ray_pbt is not None:
        print(f"  ray.tune FIFO {ray_fifo:6.1f} s   ray.tune PBT {ray_pbt:6.1f} s")
        print(f"  ray.tune PBT / its FIFO = {ray_pbt / ray_fifo:5.2f}x  (reference)")
        out.update(ray_fifo_s=ray_fifo, ray_pbt_s=ray_pbt)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="6 steps of 0.25 s")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        run(args.quick)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
