"""Data input on real Ray and torch: dataset shards, exact loader resume across kills."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import data_fns
import pytest
from conftest import run_config
from drivers import kill_driver, start_driver, wait_for_state

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(autouse=True, scope="module")
def _ship_data_fns(ray_cluster: str) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(data_fns)  # workers cannot import tests/


def _loader_config(out: Path, **extra: Any) -> dict[str, Any]:
    out.mkdir()
    # 2 ranks x 20 samples, batches of 3: 7 batches per rank and epoch; a checkpoint
    # every 4 steps lands mid-epoch
    return {"n": 40, "batch": 3, "epochs": 3, "every": 4, "out": str(out), **extra}


def _sequences(out: Path) -> list[list[list[int]]]:
    return [data_fns.batches_by_step(out / f"rank{r}.jsonl") for r in range(2)]


def test_two_workers_get_disjoint_equal_shares_and_unsplit_datasets_whole(
    tmp_path: Path,
) -> None:
    import ray.data

    out = tmp_path / "out"
    out.mkdir()
    datasets = {
        "materialized": ray.data.from_items([{"id": i} for i in range(40)]),
        "streaming": ray.data.range(30).map_batches(lambda b: b),
        "val": ray.data.range(9),
    }
    TorchTrainer(
        data_fns.shard_rows,
        train_loop_config={"names": list(datasets), "out": str(out), "epochs": 2},
        datasets=datasets,
        dataset_config=train.DataConfig(datasets_to_split=["materialized", "streaming"]),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "shards"),
    ).fit()
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for name, n in (("materialized", 40), ("streaming", 30)):
        for epoch in range(2):
            a, b = seen[0][name][epoch], seen[1][name][epoch]
            assert len(a) == len(b) == n // 2, (name, epoch)
            assert sorted(a + b) == list(range(n)), (name, epoch)
    for rank in range(2):
        assert [sorted(e) for e in seen[rank]["val"]] == [list(range(9))] * 2


def test_a_worker_sigkilled_mid_epoch_sees_the_batches_of_a_run_without_the_kill(
    tmp_path: Path,
) -> None:
    reference = tmp_path / "reference"
    TorchTrainer(
        data_fns.loader_loop,
        train_loop_config=_loader_config(reference),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "reference"),
    ).fit()
    killed = tmp_path / "killed"
    # rank 1 dies at step 10, mid-epoch 1, after the checkpoint of step 8
    config = _loader_config(killed, die={"rank": 1, "step": 10}, mode="ASYNC")
    result = TorchTrainer(
        data_fns.loader_loop,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "killed", failure_config=train.FailureConfig(max_failures=1)
        ),
    ).fit()
    assert result.metrics["step"] == 21
    attempts = [json.loads(x)["attempt"] for x in (killed / "rank1.jsonl").read_text().splitlines()]
    assert attempts[-1] == 1  # it did resume
    assert _sequences(killed) == _sequences(reference)


DRIVER = """
from lumos.train.torch import TorchTrainer
TorchTrainer(
    data_fns.loader_loop,
    train_loop_config={config!r},
    scaling_config=train.ScalingConfig(num_workers=2),
    run_config=train.RunConfig(name="driver-kill", storage_path={path!r}, verbose=False),
).fit()
"""


def test_a_driver_sigkilled_mid_epoch_and_rerun_sees_the_batches_of_a_run_without_the_kill(
    tmp_path: Path, ray_cluster: str
) -> None:
    reference = tmp_path / "reference"
    TorchTrainer(
        data_fns.loader_loop,
        train_loop_config=_loader_config(reference),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "reference"),
    ).fit()
    killed = tmp_path / "killed"
    config = _loader_config(killed, pace_s=0.1)
    body = DRIVER.format(path=str(tmp_path), config=config)
    proc = start_driver(tmp_path, ray_cluster, "data_fns", body)
    storage = RunStorage(tmp_path, "driver-kill")
    try:  # mid-epoch 1
        wait_for_state(proc, storage, lambda s: s.latest_checkpoint == "step=8", "step=8")
    finally:
        kill_driver(
            proc,
        )
    result = TorchTrainer(
        data_fns.loader_loop,
        train_loop_config=dict(config, pace_s=0.0),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="driver-kill", storage_path=str(tmp_path), verbose=False),
    ).fit()
    assert result.metrics["step"] == 21
    assert _sequences(killed) == _sequences(reference)
