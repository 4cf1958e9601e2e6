"""An experiment on a real S3 API (moto server on 127.0.0.1): checkpoints, study, resume."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from ray import cloudpickle

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage.testing import S3Server, s3_server

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def checkpointing(config: dict[str, Any]) -> None:
    start = 0
    if (ckpt := tune.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    for step in range(start, 3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            tune.report(
                {"loss": config["x"] + step, "start": start},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
        if step == 1 and tune.get_context().get_attempt() == 0 and config.get("flaky"):
            raise RuntimeError("flaky")


def test_sweep_on_s3_in_process_then_resume(s3: S3Server, tmp_path: Any) -> None:
    bucket = s3.create_bucket()
    fs = s3.filesystem()
    runs: list[str] = []
    lock = threading.Lock()

    def trainable(config: dict[str, Any]) -> None:
        with lock:
            runs.append(tune.get_context().get_trial_name())
        checkpointing(config)

    def fit() -> tune.ResultGrid:
        return tune.Tuner(
            trainable,
            param_space={"x": tune.uniform(0, 1)},
            tune_config=tune.TuneConfig(
                metric="loss",
                mode="min",
                num_samples=3,
                max_concurrent_trials=2,
                sampler=optuna.samplers.RandomSampler(seed=0),
            ),
            run_config=tune.RunConfig(
                name="s3-sweep",
                storage_path=f"s3://{bucket}/sweeps",
                storage_filesystem=fs,
                verbose=0,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            ),
            _pool_factory=lambda r: FakeWorkerPool(r),
        ).fit()

    grid = fit()
    assert grid.num_terminated == 3
    assert len(runs) == 3
    best = grid.get_best_result()
    assert best.path == f"s3://{bucket}/sweeps/s3-sweep/{best.trial_name}"
    assert best.checkpoint is not None
    with best.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "step")).read() == "2"
    ckpts = [
        p
        for p in fs.ls(f"{bucket}/sweeps/s3-sweep/{best.trial_name}", detail=False)
        if os.path.basename(p).startswith("checkpoint_")
    ]
    assert [os.path.basename(p) for p in ckpts] == ["checkpoint_000003"]  # num_to_keep=1

    again = fit()
    assert len(runs) == 3  # resumed: nothing ran again
    assert [r.metrics for r in again] == [r.metrics for r in grid]

    local = tune.export_study_journal(
        f"s3://{bucket}/sweeps", "s3-sweep", str(tmp_path / "study.journal"), storage_filesystem=fs
    )
    study = optuna.load_study(
        study_name="s3-sweep", storage=JournalStorage(JournalFileBackend(local))
    )
    assert sorted(t.value for t in study.trials) == sorted(r.metrics["loss"] for r in grid)


def test_ray_trials_checkpoint_to_s3_and_retry_from_there(ray_cluster: Any, s3: S3Server) -> None:
    bucket = s3.create_bucket()
    grid = tune.Tuner(
        checkpointing,
        param_space={"x": tune.uniform(0, 1), "flaky": True},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=2, max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(
            name="s3-ray",
            storage_path=f"s3://{bucket}/sweeps",
            storage_filesystem=s3.filesystem(),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
        ),
    ).fit()
    assert grid.num_terminated == 2
    for result in grid:
        assert result.metrics["start"] == 2  # the retry resumed after the step-1 checkpoint
        assert [e.error_message for e in result.errors] == ["flaky"]
        with result.checkpoint.as_directory() as d:  # type: ignore[union-attr]
            assert open(os.path.join(d, "step")).read() == "2"
