"""lumos.train's Ray Data input against ray.train V2, in the same run; loader positions.

Budget (DESIGN.md, issue 14):
  (1) 200,000 rows x 64 float32 features into 2 workers through
      ``get_dataset_shard("train").iter_torch_batches(batch_size=1024)``: lumos at
      least 1.0x Ray Train V2's rows/s, and its first batch in at most 0.5x Ray's time.
  (2) saving and restoring a ``prepare_data_loader`` loader's position (in-memory
      map-style dataset): under 1 ms per checkpoint.

Rows/s: all rows of both ranks over the span from the first rank's first
``get_dataset_shard`` call to the last rank's last batch. First batch: from the
training function's start to its first batch (the slower rank); ``fit()`` -> first
batch is printed too. The dataset is ``ray.data.from_numpy`` (already materialized,
as a small in-memory dataset is); the same dataset through a lazy ``map_batches``
(Ray's streaming split in lumos too) is printed for reference.

Run: ``RAY_TRAIN_V2_ENABLED=1 python benchmarks/bench_data.py [--reps N] [--skip-ray-train]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from lumos import train
from lumos.train.torch import TorchTrainer

ROWS = 200_000
FEATURES = 64
BATCH = 1024
BUDGET_ROWS_VS_RAY = 1.0
BUDGET_FIRST_VS_RAY = 0.5
BUDGET_POSITION_MS = 1.0


def _ingest(get_shard: Any, rank: int, out: str) -> None:
    start = time.time()
    shard = get_shard("train")
    rows, first = 0, None
    for batch in shard.iter_torch_batches(batch_size=BATCH):
        if first is None:
            first = time.time()
        rows += len(batch["data"])
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"start": start, "first": first, "end": time.time(), "rows": rows})
    )


def lumos_fn(config: dict[str, Any]) -> None:
    _ingest(train.get_dataset_shard, train.get_context().get_world_rank(), config["out"])
    train.report({"done": 1})


def ray_fn(config: dict[str, Any]) -> None:
    import ray.train

    _ingest(ray.train.get_dataset_shard, ray.train.get_context().get_world_rank(), config["out"])


def _figures(out: str, fit_start: float) -> dict[str, float]:
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    span = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
    return {
        "rows_s": sum(r["rows"] for r in ranks) / span,
        "first_s": max(r["first"] - r["start"] for r in ranks),
        "fit_first_s": max(r["first"] for r in ranks) - fit_start,
        "rows": sum(r["rows"] for r in ranks),
    }


def lumos_run(ds: Any, storage: str) -> dict[str, float]:
    out = tempfile.mkdtemp()
    t = time.time()
    TorchTrainer(
        lumos_fn,
        train_loop_config={"out": out},
        datasets={"train": ds},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=f"data-{time.time_ns()}", storage_path=storage, verbose=False
        ),
    ).fit()
    return _figures(out, t)


def ray_run(ds: Any, storage: str) -> dict[str, float]:
    import ray.train
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    out = tempfile.mkdtemp()
    t = time.time()
    RayTorchTrainer(
        ray_fn,
        train_loop_config={"out": out},
        datasets={"train": ds},
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(storage_path=storage, name=f"data-{time.time_ns()}"),
    ).fit()
    return _figures(out, t)


def position_cost(reps: int = 200) -> dict[str, tuple[float, float]]:
    """Median save (``position_state`` + pickle) and extra restore time, in ms."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    from lumos.train._internal.torch.utils import _PreparedLoader, _stateful
    from lumos.train.torch import prepare_data_loader

    data = TensorDataset(torch.randn(ROWS, FEATURES))

    def make(kind: str) -> Any:
        if kind == "2 ranks (DistributedSampler, shuffle)":
            sampler = StatefulDistributedSampler(data, num_replicas=2, rank=0, shuffle=True)
            return _PreparedLoader(_stateful(DataLoader(data, batch_size=BATCH), sampler), None)
        return prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True))

    out = {}
    for kind in ("1 rank (shuffle)", "2 ranks (DistributedSampler, shuffle)"):
        loader = make(kind)
        it = iter(loader)
        for _ in range(50):  # 51,200 samples into the epoch
            next(it)
        saves = []
        for _ in range(reps):
            t = time.perf_counter()
            blob = pickle.dumps(loader.position_state())
            saves.append(time.perf_counter() - t)
        fresh, restored = [], []
        for _ in range(30):
            a = make(kind)
            t = time.perf_counter()
            next(iter(a))
            fresh.append(time.perf_counter() - t)
            b = make(kind)
            t = time.perf_counter()
            b.load_position(pickle.loads(blob))
            next(iter(b))
            restored.append(time.perf_counter() - t)
        extra = max(0.0, min(restored) - min(fresh))
        out[kind] = (statistics.median(saves) * 1e3, extra * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-ray-train", action="store_true")
    args = parser.parse_args()

    import numpy as np

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    from ray import data as ray_data

    ray_data.DataContext.get_current().enable_progress_bars = False
    storage = tempfile.mkdtemp()
    features = np.random.default_rng(0).random((ROWS, FEATURES), dtype=np.float32)
    ds = ray_data.from_numpy(features)
    lazy = ds.map_batches(lambda b: b)

    lumos_runs = [lumos_run(ds, storage) for _ in range(args.reps)]
    lumos_lazy = [lumos_run(lazy, storage) for _ in range(args.reps)]
    ray_runs = [] if args.skip_ray_train else [ray_run(ds, storage) for _ in range(args.reps)]

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(f"\n== Ray Data ingest: {ROWS:,} rows x {FEATURES} float32, 2 workers, batch {BATCH}")
    print(f"   (medians of {args.reps}; every run delivered {lumos_runs[0]['rows']:,.0f} rows)")
    rows = [
        ("lumos (materialized: split)", lumos_runs),
        ("lumos (lazy: streaming_split)", lumos_lazy),
    ]
    if ray_runs:
        rows.append(("ray.train V2", ray_runs))
    for name, runs in rows:
        print(
            f"  {name:32s} {med(runs, 'rows_s'):>12,.0f} rows/s   first batch "
            f"{med(runs, 'first_s'):6.3f} s   fit() -> first batch {med(runs, 'fit_first_s'):6.2f} s"
        )
    if ray_runs:
        r_rows = med(lumos_runs, "rows_s") / med(ray_runs, "rows_s")
        r_first = med(lumos_runs, "first_s") / med(ray_runs, "first_s")
        ok = r_rows >= BUDGET_ROWS_VS_RAY and r_first <= BUDGET_FIRST_VS_RAY
        print(
            f"  lumos / ray.train V2: rows/s {r_rows:.2f}x (budget >= {BUDGET_ROWS_VS_RAY}), "
            f"first batch {r_first:.2f}x (budget <= {BUDGET_FIRST_VS_RAY})  "
            f"{'OK' if ok else 'OVER BUDGET'}"
        )
        lazy_rows = med(lumos_lazy, "rows_s") / med(ray_runs, "rows_s")
        lazy_first = med(lumos_lazy, "first_s") / med(ray_runs, "first_s")
        print(
            f"  lumos lazy / ray.train V2: rows/s {lazy_rows:.2f}x, first batch {lazy_first:.2f}x"
        )

    print(f"\n== Loader position per checkpoint ({ROWS:,} in-memory samples, batch {BATCH})")
    for kind, (save, restore) in position_cost().items():
        total = save + restore
        status = "OK" if total < BUDGET_POSITION_MS else "OVER BUDGET"
        print(
            f"  {kind:40s} save {save:.3f} ms + restore {restore:.3f} ms = {total:.3f} ms "
            f"(budget < {BUDGET_POSITION_MS} ms) {status}"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
