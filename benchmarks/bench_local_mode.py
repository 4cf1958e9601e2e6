"""Local mode (``num_workers=0``): ``train.report`` cost in the training thread, lumos vs ray.train.

Both run the function in this process. lumos also writes the metrics history and commits
checkpoints to the run's storage; Ray's local mode keeps only the last report in memory.

    .venv/bin/python benchmarks/bench_local_mode.py [REPORTS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


def _timed_loop(report: Any, out: list[float]) -> None:
    for i in range(N):
        t0 = time.perf_counter()
        report({"i": i, "loss": 1.0 / (i + 1)})
        out.append(time.perf_counter() - t0)


def lumos_run(storage: str) -> tuple[float, float]:
    from lumos import train

    times: list[float] = []
    t0 = time.perf_counter()
    train.DataParallelTrainer(
        lambda: _timed_loop(train.report, times),
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(name="bench", storage_path=storage, verbose=0),
    ).fit()
    return statistics.median(times) * 1e6, time.perf_counter() - t0


def ray_run(storage: str) -> tuple[float, float]:
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    times: list[float] = []
    t0 = time.perf_counter()
    DataParallelTrainer(
        lambda: _timed_loop(ray.train.report, times),
        scaling_config=ray.train.ScalingConfig(num_workers=0),
        run_config=ray.train.RunConfig(name="bench", storage_path=storage),
    ).fit()
    return statistics.median(times) * 1e6, time.perf_counter() - t0


if __name__ == "__main__":
    import logging
    import os

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    logging.getLogger("ray").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as d:
        lm, lt = lumos_run(d + "/lumos")
        rm, rt = ray_run(d + "/ray")
    print(f"{N} metrics-only reports in local mode (median per report, whole fit())")
    print(f"  lumos    {lm:7.1f} us   {lt:6.2f} s (history written to storage)")
    print(f"  ray.train {rm:7.1f} us   {rt:6.2f} s (kept in memory only)")
    print(f"  ratio lumos/ray: {lm / rm:.2f}x per report, {lt / rt:.2f}x per fit()")
