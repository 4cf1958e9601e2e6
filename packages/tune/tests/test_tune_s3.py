"""An experiment on a real S3 API (moto server on 127.0.0.1): checkpoints, study, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
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


KILLED_DRIVER = textwrap.dedent(
    """
    import os, signal, sys, uuid
    import optuna, ray
    from lumos import tune
    from lumos.storage.testing import s3_filesystem

    address, endpoint, path, marks, mode = sys.argv[1:6]
    ray.init(address=address, log_to_driver=False)
    fs = s3_filesystem(endpoint)

    def trainable(config):
        name = tune.get_context().get_trial_name()
        open(os.path.join(marks, f"{name}.{uuid.uuid4().hex}"), "w").close()
        tune.report({"loss": config["x"]})

    class KillOnComplete(tune.Callback):
        def on_trial_complete(self, trial):
            # The driver dies the moment it has told anyone that trial 1 ended.
            if trial.trial_name == "trial_00001":
                open(os.path.join(marks, "..", "told"), "w").write(trial.trial_name)
                os.kill(os.getpid(), signal.SIGKILL)

    if mode == "first":
        tuner = tune.Tuner(
            trainable,
            param_space={"x": tune.uniform(0, 1)},
            tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=3,
                                        max_concurrent_trials=1,
                                        sampler=optuna.samplers.RandomSampler(seed=0)),
            run_config=tune.RunConfig(
                name=path.rsplit("/", 1)[1], storage_path=path.rsplit("/", 1)[0],
                storage_filesystem=fs, verbose=0, callbacks=[KillOnComplete()]),
        )
    else:
        tuner = tune.Tuner.restore(path, trainable, storage_filesystem=fs)
    grid = tuner.fit()
    print("STATUS", " ".join(f"{r.trial_name}={r.status}" for r in grid), flush=True)
    """
)


def test_a_trial_end_told_to_a_callback_survives_a_driver_sigkill_on_s3(
    ray_cluster: Any, s3: S3Server, tmp_path: Any
) -> None:
    # The Tune journal on an object store is written in chunks; a trial end must be in one
    # before a callback hears of it, or a restore would run the trial again.
    bucket = s3.create_bucket()
    path = f"s3://{bucket}/sweeps/killed"
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER)
    marks = tmp_path / "marks"
    marks.mkdir()
    address = ray_cluster.address_info["address"]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")

    def driver(mode: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(script), address, s3.endpoint_url, path, str(marks), mode]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    first = driver("first")
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    assert (tmp_path / "told").read_text() == "trial_00001"

    rerun = driver("restore")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    status = "STATUS trial_00000=TERMINATED trial_00001=TERMINATED trial_00002=TERMINATED"
    assert status in rerun.stdout
    runs = sorted(mark.split(".")[0] for mark in os.listdir(marks))
    assert runs == ["trial_00000", "trial_00001", "trial_00002"]  # none ran twice
