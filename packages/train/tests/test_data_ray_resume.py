"""Ray Data on real Ray: a materialized, split dataset resumes exactly mid-epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import data_fns
import data_resume_fns
import pytest
from conftest import run_config

from lumos import train
from lumos.train.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(autouse=True, scope="module")
def _ship_fns(ray_cluster: str) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(data_resume_fns)  # workers cannot import tests/


def _fit(tmp_path: Path, name: str, **extra: Any) -> train.Result:
    import ray.data

    out = tmp_path / name
    out.mkdir()
    # 2 ranks x 20 rows, batches of 3: 7 batches per rank and epoch; a checkpoint every
    # 4 steps lands mid-epoch
    config = {"batch": 3, "epochs": 3, "every": 4, "out": str(out), **extra}
    return TorchTrainer(
        data_resume_fns.shard_loop,
        train_loop_config=config,
        datasets={"train": ray.data.from_items([{"id": i} for i in range(40)])},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, name, failure_config=train.FailureConfig(max_failures=1)),
    ).fit()


def _sequences(out: Path) -> list[list[list[int]]]:
    return [data_fns.batches_by_step(out / f"rank{r}.jsonl") for r in range(2)]


def test_a_worker_sigkilled_mid_epoch_sees_the_batches_of_a_run_without_the_kill(
    tmp_path: Path,
) -> None:
    _fit(tmp_path, "reference")
    # rank 1 dies at step 10, mid-epoch 1, after the checkpoint of step 8 (2 batches in)
    result = _fit(tmp_path, "killed", die={"rank": 1, "step": 10})
    assert result.metrics["step"] == 21
    killed = tmp_path / "killed"
    lines = [json.loads(x) for x in (killed / "rank1.jsonl").read_text().splitlines()]
    assert lines[-1]["attempt"] == 1  # it did resume
    # the resumed attempt starts at the checkpoint's step, inside epoch 1
    first_resumed = next(x for x in lines if x["attempt"] == 1)
    assert (first_resumed["step"], first_resumed["epoch"]) == (8, 1)
    assert _sequences(killed) == _sequences(tmp_path / "reference")
