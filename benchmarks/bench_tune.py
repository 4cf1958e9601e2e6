"""Trivial-trial throughput of lumos.tune vs bare Ray and ray.tune, and driver memory.

Three ways to run the same sweep of trivial trials (one report each, 2 trials at a
time), measured in the same run on the same Ray cluster:

* floor: what bare Ray does -- optuna ask/tell in the driver, 2 reused actors,
  results gathered with ``ray.wait`` (no storage, no reports, no pruning);
* lumos.tune: ``Tuner(...).fit()`` with its journal on local storage;
  (floor and lumos run interleaved, 3 rounds each; the best round of each counts,
  since the machine is shared);
* ray.tune with ``OptunaSearch`` (fewer trials: it is slow; rates are compared).

Two sweeps: 200 trials with TPE (TPE's own cost dominates both sides) and 10,000
trials with ``RandomSampler`` (only the control plane is left). ray.tune is far too
slow for 10,000 trials here: it runs 20 and the per-trial costs are compared.

Then the driver's peak RSS and the files written, for a 200- and a 10,000-trial lumos
sweep (RandomSampler), each in a fresh subprocess so that earlier parts do not count.

Budget (DESIGN.md): lumos >= 0.6x the floor (both sweeps), >= 100x ray.tune, peak RSS
at 10,000 trials <= 1.1x that at 200, O(1) files per trial (the journals only).

Then population-based training (``tune_pbt_section.py``): lumos's PBT against its own
FIFO on the same 4 trials x 12 steps (budget <= 1.2x), ray.tune's PBT against its FIFO
for reference. ``--pbt`` runs only that part, ``--rss`` only the driver RSS and files part.

Run: ``/work/venv/bin/python benchmarks/bench_tune.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import optuna
import ray

TRIALS = 200
BIG_TRIALS = 10_000
RAY_TUNE_TRIALS = 20
RSS_TRIALS = (200, 10_000)
CONCURRENCY = 2
ROUNDS = 3


def objective(config: dict[str, Any]) -> None:
    from lumos import tune

    tune.report({"loss": (config["x"] - 2.0) ** 2})


# -- floor: bare Ray -------------------------------------------------------------------------


@ray.remote(num_cpus=1)
class _Runner:
    def run(self, x: float) -> float:
        return (x - 2.0) ** 2


def _sampler(kind: str) -> optuna.samplers.BaseSampler:
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=0)
    return optuna.samplers.TPESampler(seed=0)


def bare_ray(n: int, sampler: str = "tpe") -> float:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    study = optuna.create_study(sampler=_sampler(sampler))
    actors = [_Runner.remote() for _ in range(CONCURRENCY)]
    inflight: dict[Any, tuple[Any, optuna.Trial]] = {}
    asked = done = 0
    while done < n:
        idle = [a for a in actors if a not in {v[0] for v in inflight.values()}]
        while idle and asked < n:
            trial = study.ask()
            x = trial.suggest_float("x", -10, 10)
            actor = idle.pop()
            inflight[actor.run.remote(x)] = (actor, trial)
            asked += 1
        ready, _ = ray.wait(list(inflight), num_returns=1)
        for ref in ready:
            _, trial = inflight.pop(ref)
            study.tell(trial, ray.get(ref))
            done += 1
    elapsed = time.perf_counter() - t0
    for a in actors:
        ray.kill(a)
    return n / elapsed


# -- lumos.tune --------------------------------------------------------------------------------


def lumos_tune(n: int, storage: str, name: str, sampler: str = "tpe") -> float:
    from lumos import tune

    t0 = time.perf_counter()
    grid = tune.Tuner(
        objective,
        param_space={"x": tune.uniform(-10, 10)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=n,
            max_concurrent_trials=CONCURRENCY,
            sampler=_sampler(sampler),
        ),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()
    elapsed = time.perf_counter() - t0
    assert len(grid) == n, grid
    assert grid.num_terminated == n, (grid, grid.errors)
    return n / elapsed


# -- ray.tune with OptunaSearch ----------------------------------------------------------------


def _ray_tune_objective(config: dict[str, Any]) -> None:
    from ray import tune as ray_tune

    ray_tune.report({"loss": (config["x"] - 2.0) ** 2})


def ray_tune(n: int, storage: str) -> float | None:
    try:
        from ray import tune as ray_tune
        from ray.tune.search.optuna import OptunaSearch
    except ImportError as exc:
        print(f"ray.tune unavailable ({exc}); pip install 'ray[tune]' to compare")
        return None
    t0 = time.perf_counter()
    tuner = ray_tune.Tuner(
        _ray_tune_objective,
        param_space={"x": ray_tune.uniform(-10, 10)},
        tune_config=ray_tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=n,
            max_concurrent_trials=CONCURRENCY,
            search_alg=OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0)),
        ),
        run_config=ray_tune.RunConfig(name="bench-ray-tune", storage_path=storage, verbose=0),
    )
    results = tuner.fit()
    elapsed = time.perf_counter() - t0
    assert len(results) == n
    return n / elapsed


# -- driver RSS for a long sweep (subprocess) --------------------------------------------------


def _peak_rss_mb() -> float:
    # VmHWM: this process image's peak RSS. (getrusage's ru_maxrss would also count the
    # parent's peak, inherited across fork+exec on Linux.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def _count_files(path: str) -> int:
    return sum(len(files) + len(dirs) for _, dirs, files in os.walk(path))


def _rss_child(n: int, storage: str, address: str) -> None:
    ray.init(address=address, log_to_driver=False)
    name = f"bench-rss-{n}"
    rate = lumos_tune(n, storage, name, sampler="random")
    files = _count_files(os.path.join(storage, name))
    print(json.dumps({"rate": rate, "peak_rss_mb": _peak_rss_mb(), "files": files}))


def _rss_floor_child(n: int, address: str) -> None:
    ray.init(address=address, log_to_driver=False)
    rate = bare_ray(n, "random")
    print(json.dumps({"rate": rate, "peak_rss_mb": _peak_rss_mb(), "files": 0}))


def driver_rss(n: int, storage: str, address: str, floor: bool = False) -> dict[str, float]:
    child = (
        ["--rss-floor-child", str(n), address]
        if floor
        else ["--rss-child", str(n), storage, address]
    )
    out = subprocess.run(
        [sys.executable, __file__, *child],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    return dict(json.loads(line))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--rss-child", nargs=3, metavar=("N", "STORAGE", "ADDRESS"))
    parser.add_argument("--rss-floor-child", nargs=2, metavar=("N", "ADDRESS"))
    parser.add_argument("--pbt", action="store_true", help="only the PBT section")
    parser.add_argument("--rss", action="store_true", help="only the driver RSS / files section")
    args = parser.parse_args()
    if args.pbt:
        _pbt_section(args.quick)
        return
    if args.rss:
        _rss_section(args.quick)
        return
    if args.rss_child:
        n, storage, address = args.rss_child
        _rss_child(int(n), storage, address)
        return
    if args.rss_floor_child:
        n, address = args.rss_floor_child
        _rss_floor_child(int(n), address)
        return

    trials = 40 if args.quick else TRIALS
    big = 1000 if args.quick else BIG_TRIALS
    ray_trials = 4 if args.quick else RAY_TUNE_TRIALS
    rss_sizes = (200, 1000) if args.quick else RSS_TRIALS
    rounds = 1 if args.quick else ROUNDS
    big_rounds = 1 if args.quick else 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ctx = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    address = ctx.address_info["address"]
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as storage:
        # warm-up: first actor start-up and imports on the workers
        bare_ray(10)
        lumos_tune(10, storage, "bench-warmup")

        # The machine is shared: interleave the two and keep each one's best round.
        sweeps: dict[str, tuple[int, list[float], list[float]]] = {}
        for label, n, sampler, k in (
            ("TPE", trials, "tpe", rounds),
            ("RandomSampler", big, "random", big_rounds),
        ):
            floors, ours_all = [], []
            for i in range(k):
                floors.append(bare_ray(n, sampler))
                ours_all.append(lumos_tune(n, storage, f"bench-lumos-{sampler}-{i}", sampler))
            sweeps[label] = (n, floors, ours_all)
            print(
                f"{label}, {n} trials, rounds (trials/s): floor {[round(f, 1) for f in floors]}, "
                f"lumos {[round(o, 1) for o in ours_all]}",
                flush=True,
            )
        theirs = ray_tune(ray_trials, storage)
        rss = {n: driver_rss(n, storage, address) for n in rss_sizes}
        floor_rss = {n: driver_rss(n, storage, address, floor=True) for n in rss_sizes}
    ray.shutdown()

    print()
    for label, (n, floors, ours_all) in sweeps.items():
        floor, ours = max(floors), max(ours_all)
        ratio_floor = ours / floor
        print(f"trivial trials, {label}, {n} trials, max_concurrent_trials={CONCURRENCY}")
        print(
            f"  bare Ray floor (ask/tell + 2 actors): {floor:8.1f} trials/s  "
            f"({1e3 / floor:.2f} ms/trial, best of {len(floors)})"
        )
        print(
            f"  lumos.tune:                           {ours:8.1f} trials/s  "
            f"({1e3 / ours:.2f} ms/trial, best of {len(ours_all)})"
        )
        print(
            f"  lumos / floor    = {ratio_floor:6.2f}x   (budget >= 0.6x)  "
            f"{'OK' if ratio_floor >= 0.6 else 'OVER BUDGET'}"
        )
    tpe_rate = max(sweeps["TPE"][2])
    if theirs is not None:
        print(
            f"  ray.tune + OptunaSearch (TPE):        {theirs:8.2f} trials/s  "
            f"({1e3 / theirs:.0f} ms/trial, {ray_trials} trials: 10,000 would take "
            f"{BIG_TRIALS / theirs / 60:.0f} min)"
        )
        ratio_ray = tpe_rate / theirs
        print(
            f"  lumos / ray.tune = {ratio_ray:6.1f}x per-trial cost, TPE  (budget >= 100x)  "
            f"{'OK' if ratio_ray >= 100 else 'OVER BUDGET'}"
        )
    _print_rss(rss, floor_rss, rss_sizes)
    _pbt_section(args.quick)


def _rss_section(quick: bool) -> None:
    rss_sizes = (200, 1000) if quick else RSS_TRIALS
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ctx = ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tune-") as storage:
            address = ctx.address_info["address"]
            rss = {n: driver_rss(n, storage, address) for n in rss_sizes}
            floor_rss = {n: driver_rss(n, storage, address, floor=True) for n in rss_sizes}
    finally:
        ray.shutdown()
    _print_rss(rss, floor_rss, rss_sizes)


def _print_rss(
    rss: dict[int, dict[str, float]],
    floor_rss: dict[int, dict[str, float]],
    rss_sizes: tuple[int, ...],
) -> None:
    small, large = rss[rss_sizes[0]], rss[rss_sizes[-1]]
    growth = large["peak_rss_mb"] / small["peak_rss_mb"]
    print(
        f"driver peak RSS (RandomSampler): {small['peak_rss_mb']:.0f} MB at {rss_sizes[0]} "
        f"trials, {large['peak_rss_mb']:.0f} MB at {rss_sizes[-1]} -> {growth:.3f}x "
        f"(budget <= 1.1x) {'OK' if growth <= 1.1 else 'OVER BUDGET'}"
    )
    # The same sweep with bare Ray (ask/tell in an in-memory Optuna study, 2 actors):
    # what Ray and Optuna themselves add over the same number of trials.
    f_small, f_large = floor_rss[rss_sizes[0]], floor_rss[rss_sizes[-1]]
    f_mb = f_large["peak_rss_mb"] - f_small["peak_rss_mb"]
    l_mb = large["peak_rss_mb"] - small["peak_rss_mb"]
    extra = rss_sizes[-1] - rss_sizes[0]
    print(
        f"  bare-Ray floor: {f_small['peak_rss_mb']:.0f} MB -> {f_large['peak_rss_mb']:.0f} MB "
        f"({f_large['peak_rss_mb'] / f_small['peak_rss_mb']:.2f}x, +{f_mb:.1f} MB); lumos "
        f"+{l_mb:.1f} MB: {l_mb / max(f_mb, 1e-9):.2f}x the floor's growth, "
        f"{(l_mb - f_mb) * 1024 / extra:.2f} KB per trial beyond it"
    )
    flat = large["files"] == small["files"]
    print(
        f"files written: {small['files']} for {rss_sizes[0]} trials, {large['files']} for "
        f"{rss_sizes[-1]} ({large['files'] / rss_sizes[-1]:.4f} per trial; budget O(1)) "
        f"{'OK' if flat else 'GROWS WITH TRIALS'}"
    )


def _pbt_section(quick: bool) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tune_pbt_section

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        tune_pbt_section.run(quick)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
