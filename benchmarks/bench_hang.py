"""The hang watchdog: stall -> detection, culprit accuracy, cost; ray.train V2 beside it.

Scenario (2 CPU workers, torch + gloo): every step sleeps ``--step-ms`` (the compute),
all-reduces a tensor and reports. At step 5 a random rank sleeps for an hour before its
all-reduce; the others wait in the all-reduce.

Goals (issue 26):
  (1) stall -> detection (the watchdog fired) <= hang_timeout_s + 2 s;
  (2) the culprit named correctly in N of N runs (random culprit rank);
  (3) the watchdog's cost on step time < 1% (the default timeout, 600 s, samples every
      0.5 s; the benchmark's 3 s timeout samples every 0.3 s: both are measured);
  (4) ray.train V2 on the same stall: it has no watchdog, so it waits for gloo's
      collective timeout (30 min by default); waited for a bounded ``--ray-wait`` s.

Run: ``python benchmarks/bench_hang.py [--reps 20] [--quick] [--skip-ray-train]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from lumos import train
from lumos.train.torch import TorchConfig, TorchTrainer

TIMEOUT_S = 3.0
STALL_STEP = 5
WORKERS = 2


# training functions (shipped by value: this file is __main__) ----------------------
def _loop(config: dict[str, Any], report: Any, rank: int) -> None:
    import torch
    import torch.distributed as dist

    step_s = config["step_ms"] / 1000
    times: list[float] = []
    for step in range(config["steps"]):
        if rank == config.get("culprit") and step == STALL_STEP:
            with open(config["stalled"], "w") as f:
                f.write(str(time.time()))
            time.sleep(3600)
        t0 = time.perf_counter()
        time.sleep(step_s)
        dist.all_reduce(torch.ones(1))
        times.append(time.perf_counter() - t0)
        report(step)
    if rank == 0 and config.get("times"):
        with open(config["times"], "w") as f:
            json.dump(times, f)


def lumos_fn(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    _loop(config, lambda step: train.report({"step": step}), rank)


def ray_fn(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    _loop(config, lambda step: None, rank)


# drivers -----------------------------------------------------------------------------
def _lumos(
    work: str, config: dict[str, Any], timeout_s: float | None
) -> tuple[str, BaseException | None]:
    name = f"hang-{time.time_ns()}"
    failure = train.FailureConfig(max_failures=0, hang_timeout_s=timeout_s)
    error: BaseException | None = None
    try:
        TorchTrainer(
            lumos_fn,
            train_loop_config=config,
            torch_config=TorchConfig(timeout_s=1800),
            scaling_config=train.ScalingConfig(num_workers=WORKERS),
            run_config=train.RunConfig(
                storage_path=work, name=name, verbose=False, failure_config=failure
            ),
        ).fit()
    except train.TrainingFailedError as exc:
        error = exc
    return os.path.join(work, name), error


def stall_once(work: str, culprit: int, step_ms: float) -> tuple[float, list[int]]:
    """One stalled run: (stall -> detection in s, the culprits named)."""
    stalled = os.path.join(tempfile.mkdtemp(prefix="bench-hang-"), "stalled")
    config = {"steps": 1000, "step_ms": step_ms, "culprit": culprit, "stalled": stalled}
    run, error = _lumos(work, config, TIMEOUT_S)
    if error is None:
        raise RuntimeError("the stalled run finished: the watchdog did not fire")
    with open(os.path.join(run, "_lumos", "hangs", "attempt-0", "hang.json")) as f:
        found = json.load(f)
    with open(stalled) as f:
        t_stall = float(f.read())
    return found["fired_at_unix"] - t_stall, list(found["culprits"])


def step_times(work: str, steps: int, step_ms: float, timeout_s: float | None) -> float:
    """Median step time (s) of rank 0 in a run without a stall."""
    out = os.path.join(tempfile.mkdtemp(prefix="bench-hang-times-"), "t.json")
    _, error = _lumos(work, {"steps": steps, "step_ms": step_ms, "times": out}, timeout_s)
    if error is not None:
        raise error
    with open(out) as f:
        return statistics.median(json.load(f))


def ray_stall(work: str, wait_s: float, step_ms: float) -> str:
    """ray.train V2 on the same stall, waited for ``wait_s`` at most."""
    import ray.train
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    stalled = os.path.join(tempfile.mkdtemp(prefix="bench-hang-ray-"), "stalled")
    config = {"steps": 1000, "step_ms": step_ms, "culprit": 1, "stalled": stalled}
    outcome: list[str] = []

    def fit() -> None:
        try:
            RayTorchTrainer(
                ray_fn,
                train_loop_config=config,
                scaling_config=ray.train.ScalingConfig(num_workers=WORKERS),
                run_config=ray.train.RunConfig(storage_path=work, name=f"ray-{time.time_ns()}"),
            ).fit()
            outcome.append("finished")
        except BaseException as exc:
            outcome.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(wait_s)
    if outcome:
        return f"ended within {wait_s:.0f} s: {outcome[0]}"
    if not os.path.exists(stalled):
        return f"the stall was not reached within {wait_s:.0f} s"
    with open(stalled) as f:
        waited = time.time() - float(f.read())
    return (
        f"still hung {waited:.0f} s after the stall (no error, no stacks, no culprit named): "
        "it waits for gloo's collective timeout (TorchConfig.timeout_s, 1800 s by default)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="stalled runs (random culprit)")
    parser.add_argument("--quick", action="store_true", help="3 stalled runs, short cost runs")
    parser.add_argument("--skip-ray-train", action="store_true", help="skip ray.train V2")
    parser.add_argument("--ray-wait", type=float, default=120.0, help="how long to wait for Ray")
    parser.add_argument("--step-ms", type=float, default=20.0, help="compute per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reps = 3 if args.quick else args.reps
    cost_steps, cost_reps = (150, 1) if args.quick else (500, 3)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="lumos-bench-hang-")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(f"bench_hang: {WORKERS} CPU workers, hang_timeout_s={TIMEOUT_S}, reps={reps}, "
          f"cores={os.cpu_count()}, load avg={os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    delays: list[float] = []
    right = 0
    for i in range(reps):
        culprit = rng.randrange(WORKERS)
        delay, named = stall_once(work, culprit, args.step_ms)
        delays.append(delay)
        right += named == [culprit]
        print(f"    run {i}: culprit {culprit}, named {named}, detected after {delay:.2f} s",
              flush=True)  # fmt: skip
    goal = TIMEOUT_S + 2
    worst = max(delays)
    print(f"\n(1) stall -> detection: median {statistics.median(delays):.2f} s, max {worst:.2f} s "
          f"(goal <= {goal:.1f} s): {'OK' if worst <= goal else 'MISSED'}")  # fmt: skip
    print(f"(2) culprit correct: {right} of {reps}: {'OK' if right == reps else 'MISSED'}")

    off, default, short = [], [], []
    for _ in range(cost_reps):  # interleaved, so load changes hit all three alike
        off.append(step_times(work, cost_steps, args.step_ms, None))
        default.append(step_times(work, cost_steps, args.step_ms, 600.0))
        short.append(step_times(work, cost_steps, args.step_ms, TIMEOUT_S))
    base = statistics.median(off)
    for label, xs in (("default 600 s", default), (f"{TIMEOUT_S:.0f} s", short)):
        ratio = statistics.median(xs) / base
        verdict = "OK" if ratio < 1.01 else "over 1% (noise on a loaded machine?)"
        print(f"(3) step time with the watchdog ({label}) / without: {ratio:.4f} "
              f"({statistics.median(xs) * 1000:.2f} ms vs {base * 1000:.2f} ms): {verdict}")  # fmt: skip

    if not args.skip_ray_train:
        print(f"(4) ray.train V2, same stall: {ray_stall(work, args.ray_wait, args.step_ms)}",
              flush=True)  # fmt: skip
        ray.shutdown()
        os._exit(0)  # its fit() thread is still waiting in the stalled run
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
