"""Async validation and health rollback: lumos.train against ray.train V2 (2.58), same run.

Budget (issue 12):
  (1) Validation overlaps training. 2 CPU workers, ``steps`` steps of ``step_s`` of
      "training", a checkpoint at every step, each validated by a ``val_s`` validation
      task (``train.report(..., validation=True)``). The run's wall time (``fit()``
      call to return, so it includes waiting for the last validations) with
      validation is at most 1.1x the same run without, and no more than Ray's with
      validation. Ray Train V2 runs the same loop with its ``ValidationConfig``.
      Ray has no equivalent for (2).
  (2) Health rollback: the time from the bad report (rank 0 reports a NaN loss; a
      ``NonFiniteMetric`` check fires in the driver) to training running again
      from the earlier checkpoint (every rank back in the training function, after a
      ``torch.distributed`` barrier) is at most the time from a worker's SIGKILL to
      training running again in the same run (``FailureConfig(max_failures=1)``).

Run: ``RAY_TRAIN_V2_ENABLED=1 python benchmarks/bench_health.py [--reps N] [--steps N]
[--skip-ray]`` (or ``nox -s bench -- bench_health.py``). Ray needs pyarrow.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from lumos import train
from lumos.train.torch import TorchTrainer

BUDGET_VAL_VS_NONE = 1.1
BUDGET_VAL_VS_RAY = 1.0
BUDGET_ROLLBACK_VS_KILL = 1.0
BAD_STEP = 5
STEPS_ROLLBACK = 8


# ----------------------------------------------------------------------------------
# functions (shipped by value: this file is __main__)
# ----------------------------------------------------------------------------------
def _save(d: str, step: int) -> None:
    with open(os.path.join(d, "step.json"), "w") as f:
        json.dump({"step": step}, f)


def _step_of(path: str) -> int:
    with open(os.path.join(path, "step.json")) as f:
        return int(json.load(f)["step"])


def lumos_validate(checkpoint: Any, val_s: float) -> dict[str, Any]:
    time.sleep(val_s)
    with checkpoint.as_directory() as d:
        return {"val_loss": 1.0 / (1 + _step_of(d))}


def ray_validate(checkpoint: Any, val_s: float) -> dict[str, Any]:
    time.sleep(val_s)
    with checkpoint.as_directory() as d:
        return {"val_loss": 1.0 / (1 + _step_of(d))}


def lumos_overlap(cfg: dict[str, Any]) -> None:
    for step in range(cfg["steps"]):
        time.sleep(cfg["step_s"])
        with tempfile.TemporaryDirectory() as d:
            _save(d, step)
            train.report(
                {"step": step, "loss": 1.0 / (step + 1)},
                checkpoint=train.Checkpoint.from_directory(d),
                validation=cfg["validate"],
            )


def ray_overlap(cfg: dict[str, Any]) -> None:
    import ray.train

    for step in range(cfg["steps"]):
        time.sleep(cfg["step_s"])
        with tempfile.TemporaryDirectory() as d:
            _save(d, step)
            kwargs: dict[str, Any] = {"validation": True} if cfg["validate"] else {}
            ray.train.report(
                {"step": step, "loss": 1.0 / (step + 1)},
                checkpoint=ray.train.Checkpoint.from_directory(d),
                **kwargs,
            )


def _mark(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(path + ".tmp", path)


def lumos_bad_step(cfg: dict[str, Any]) -> None:
    """Rank 0 reports a NaN at BAD_STEP (``how="nan"``), or rank 1 is SIGKILLed there."""
    import torch.distributed as dist

    marks = cfg["marks"]
    ckpt = train.get_checkpoint()
    start = 0
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = _step_of(d) + 1
    rank = train.get_context().get_world_rank()
    dist.barrier()  # the process group is complete: training runs
    if ckpt is not None and rank == 0 and not os.path.exists(os.path.join(marks, "resumed")):
        _mark(os.path.join(marks, "resumed"))
        with open(os.path.join(marks, "resumed_step"), "w") as f:
            f.write(str(start))
    for step in range(start, STEPS_ROLLBACK):
        first_time = not os.path.exists(os.path.join(marks, "bad"))
        loss = 1.0 / (step + 1)
        if step == BAD_STEP and first_time:
            if cfg["how"] == "kill" and rank == 1:
                _mark(os.path.join(marks, "bad"))
                os.kill(os.getpid(), signal.SIGKILL)
            if cfg["how"] == "nan" and rank == 0:
                loss = math.nan
                _mark(os.path.join(marks, "bad"))
        dist.barrier()
        with tempfile.TemporaryDirectory() as d:
            _save(d, step)
            train.report(
                {"step": step, "loss": loss},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step={step}",
            )


# ----------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------
def lumos_overlap_run(storage: str, cfg: dict[str, Any], validate: bool) -> float:
    t0 = time.time()
    TorchTrainer(
        lumos_overlap,
        train_loop_config={**cfg, "validate": validate},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=storage, verbose=False),
        validation_config=train.ValidationConfig(
            lumos_validate, task_config=train.ValidationTaskConfig({"val_s": cfg["val_s"]})
        ),
    ).fit()
    return time.time() - t0


def ray_overlap_run(storage: str, cfg: dict[str, Any], validate: bool) -> float:
    import ray.train
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    t0 = time.time()
    RayTorchTrainer(
        ray_overlap,
        train_loop_config={**cfg, "validate": validate},
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(storage_path=storage, name=f"val-{time.time_ns()}"),
        validation_config=ray.train.ValidationConfig(
            ray_validate, task_config=ray.train.ValidationTaskConfig({"val_s": cfg["val_s"]})
        ),
    ).fit()
    return time.time() - t0


def lumos_bad_step_run(storage: str, how: str) -> tuple[float, int]:
    marks = tempfile.mkdtemp(prefix="lumos-bench-health-")
    TorchTrainer(
        lumos_bad_step,
        train_loop_config={"marks": marks, "how": how},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            storage_path=storage,
            verbose=False,
            failure_config=train.FailureConfig(max_failures=1),
            health_checks=[train.NonFiniteMetric("loss")],
        ),
    ).fit()
    with open(os.path.join(marks, "bad")) as f:
        bad = float(f.read())
    with open(os.path.join(marks, "resumed")) as f:
        resumed = float(f.read())
    with open(os.path.join(marks, "resumed_step")) as f:
        return resumed - bad, int(f.read())


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _verdict(ok: bool) -> str:
    return "OK" if ok else "OVER BUDGET"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--val-s", type=float, default=1.0)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="bench-health-")
    cfg = {"steps": args.steps, "step_s": args.step_s, "val_s": args.val_s}
    print(
        f"(1) {args.steps} steps x {args.step_s} s, a checkpoint per step, "
        f"{args.val_s} s validation each; 2 workers; fit() wall time, median of {args.reps}"
    )
    rows: dict[str, list[float]] = {}
    for _ in range(args.reps):
        for name, fn in [("lumos", lumos_overlap_run), ("ray", ray_overlap_run)]:
            if name == "ray" and args.skip_ray:
                continue
            for validate in (False, True):
                key = f"{name} {'with' if validate else 'without'} validation"
                rows.setdefault(key, []).append(fn(storage, cfg, validate))
    for key, values in rows.items():
        print(f"    {key:28s} {_median(values):6.2f} s   {[round(v, 2) for v in values]}")
    lv, ln = _median(rows["lumos with validation"]), _median(rows["lumos without validation"])
    print(
        f"    lumos with / without validation: {lv / ln:.2f}x "
        f"(budget <= {BUDGET_VAL_VS_NONE}x) {_verdict(lv / ln <= BUDGET_VAL_VS_NONE)}"
    )
    if not args.skip_ray:
        rv, rn = _median(rows["ray with validation"]), _median(rows["ray without validation"])
        print(f"    ray with / without validation:   {rv / rn:.2f}x (reference)")
        print(
            f"    lumos / ray, with validation:    {lv / rv:.2f}x "
            f"(budget <= {BUDGET_VAL_VS_RAY}x) {_verdict(lv / rv <= BUDGET_VAL_VS_RAY)}"
        )
        print(f"    extra wall time for validation: lumos {lv - ln:.2f} s, ray {rv - rn:.2f} s")

    print(f"(2) bad step {BAD_STEP} of {STEPS_ROLLBACK}, 2 workers, a checkpoint per step")
    rollback: list[float] = []
    kill: list[float] = []
    for _ in range(args.reps):
        seconds, step = lumos_bad_step_run(storage, "nan")
        assert step == BAD_STEP, f"rolled back to step {step}, expected {BAD_STEP}"
        rollback.append(seconds)
        seconds, step = lumos_bad_step_run(storage, "kill")
        assert step == BAD_STEP, f"resumed at step {step}, expected {BAD_STEP}"
        kill.append(seconds)
    r, k = _median(rollback), _median(kill)
    print(
        f"    NaN reported -> training again (rollback): {r:.3f} s  {[round(v, 3) for v in rollback]}"
    )
    print(
        f"    SIGKILL -> training again (restart):       {k:.3f} s  {[round(v, 3) for v in kill]}"
    )
    print(
        f"    rollback / kill-to-resume: {r / k:.2f}x (budget <= {BUDGET_ROLLBACK_VS_KILL}x) "
        f"{_verdict(r / k <= BUDGET_ROLLBACK_VS_KILL)}"
    )
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
