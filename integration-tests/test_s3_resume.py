"""A Tune-over-Train sweep stored on a real S3 API (moto's server on 127.0.0.1).

The sweep's driver is a subprocess (``s3_sweep_driver.py``) connected to the
session's cluster. Phase 1 is SIGKILLed once one trial has finished and two Train
runs have committed a checkpoint and hold there; phase 2 re-runs the same script:
no finished trial runs again, and the unfinished Train runs resume from their
checkpoints.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import s3_sweep_driver as driver
from it_helpers import assert_no_uncommitted, nested_runs

from lumos import tune
from lumos.runtime.testing import assert_no_leaked_actors
from lumos.storage import RunStorage
from lumos.storage.testing import S3Server, s3_server

DRIVER = Path(driver.__file__).resolve()
NAME = "sweep"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def _wait_for(
    condition: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Poll ``condition`` (state on S3 written by another process: nothing to wait on)."""
    deadline = time.monotonic() + 240.0
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited ({proc.returncode})" if proc.returncode is not None else "timed out"
            tail = log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"phase-1 driver {why} before {what}; its output:\n{tail}")
        time.sleep(0.5)


def _equals(fn: Callable[[str], str | None], arg: str, value: str) -> Callable[[], bool]:
    return lambda: fn(arg) == value


@pytest.mark.long  # plain nox: tune's test_tune_s3 (a sweep on S3, a driver SIGKILL)
def test_sweep_on_s3_resumes_after_driver_sigkill(
    ray_cluster: str, s3: S3Server, tmp_path: Path
) -> None:
    bucket = s3.create_bucket()
    fs = s3.filesystem()
    storage_path = f"s3://{bucket}/sweeps"
    cmd = [
        sys.executable,
        str(DRIVER),
        "--address",
        ray_cluster,
        "--endpoint",
        s3.endpoint_url,
        "--bucket",
        bucket,
        "--name",
        NAME,
    ]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")

    def latest(trial: str) -> str | None:
        state = RunStorage(storage_path, NAME, fs).child(trial).child("train").load_state()
        return state.latest_checkpoint if state else None

    def first_trial_complete() -> bool:
        try:
            study = tune.load_study(storage_path, NAME, fs)
        except Exception:  # not created yet
            return False
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        return any(t.number == 0 for t in done)

    held = f"step={driver.HOLD_AT}"
    log_path = tmp_path / "phase1.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, "--phase", "1"], stdout=log, stderr=log, env=env)
        try:
            _wait_for(first_trial_complete, "trial 0 completed", proc, log_path)
            for trial in ("trial_00001", "trial_00002"):
                _wait_for(_equals(latest, trial, held), f"{trial} committed {held}", proc, log_path)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    # Ray ends the killed driver's trial actors, their Train workers and placement groups.
    assert_no_leaked_actors(timeout_s=60.0)
    before = {t: r.load_state() for t, r in nested_runs(storage_path, NAME, fs).items()}
    assert sorted(before) == ["trial_00000", "trial_00001", "trial_00002"]

    phase2 = subprocess.run(
        [*cmd, "--phase", "2"], capture_output=True, env=env, timeout=300, check=False
    )
    assert phase2.returncode == 0, phase2.stderr.decode()[-4000:]
    outcome: list[dict[str, Any]] = json.loads(phase2.stdout.decode().strip().splitlines()[-1])

    assert [t["trial"] for t in outcome] == [f"trial_{i:05d}" for i in range(4)]
    assert [t["x"] for t in outcome] == driver.XS
    assert all(t["status"] == "TERMINATED" for t in outcome), outcome
    study = tune.load_study(storage_path, NAME, fs)
    assert len(study.trials) == 4  # nothing sampled again, nothing repeated
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

    runs = nested_runs(storage_path, NAME, fs)
    for trial, run in runs.items():
        state = run.load_state()
        assert state is not None, trial
        assert state.status == "finished", (trial, state)
        steps = [row["step"] for row in run.read_metrics()]
        assert steps == list(range(1, driver.STEPS + 1)), (trial, steps)
    # the finished trial did not run again
    finished_before = before["trial_00000"]
    assert finished_before is not None
    assert finished_before.status == "finished"
    after_0 = runs["trial_00000"].load_state()
    assert after_0 is not None
    assert len(after_0.attempts) == len(finished_before.attempts) == 1
    # the held Train runs resumed from their own checkpoints
    for trial in ("trial_00001", "trial_00002"):
        last = runs[trial].read_metrics()[-1]
        assert last["resumed_from"] == driver.HOLD_AT, (trial, last)
        after = runs[trial].load_state()
        assert after is not None
        assert len(after.attempts) == 2
    assert runs["trial_00003"].read_metrics()[-1]["resumed_from"] == 0

    assert_no_uncommitted(storage_path, NAME, fs)
