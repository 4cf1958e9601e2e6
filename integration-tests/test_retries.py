"""Retries in Tune over Train: a worker failure is Train's to retry, inside the trial.

Rank 1's process exits after step 2 of the first attempt. The Train run restarts
from its ``step=2`` checkpoint and finishes; Tune sees one trial attempt that
ends TERMINATED, with every step reported once.
"""

from __future__ import annotations

import os
from typing import Any

import workloads
from it_helpers import assert_no_uncommitted, nested_runs

from lumos import train, tune
from lumos.train.torch import TorchTrainer

STEPS = 4
CRASH_AT = 2


def _trial(config: dict[str, Any]) -> None:
    TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"x": config["x"], "steps": STEPS, "crash_at": CRASH_AT},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(failure_config=train.FailureConfig(max_failures=1)),
    ).fit()


def test_worker_failure_is_retried_by_train_inside_the_trial(
    ray_cluster: str, storage_dir: str
) -> None:
    grid = tune.Tuner(
        _trial,
        param_space={"x": 1.0},
        tune_config=tune.TuneConfig(metric="loss", mode="min", trial_resources={"CPU": 0}),
        run_config=tune.RunConfig(
            name="retry",
            storage_path=storage_dir,
            failure_config=tune.FailureConfig(max_failures=0),  # Tune must not need to retry
            verbose=0,
        ),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED", result.error
    assert result.errors == []  # no trial-level failure
    assert result.metrics["step"] == STEPS
    assert result.metrics["resumed_from"] == CRASH_AT
    # the trial saw each step once, in order, across the restart
    assert list(result.metrics_dataframe["step"]) == list(range(1, STEPS + 1))

    run = nested_runs(storage_dir, "retry")[result.trial_name]
    state = run.load_state()
    assert state is not None
    assert state.status == "finished"
    assert [a.status for a in state.attempts] == ["errored", "finished"]
    assert [row["step"] for row in run.read_metrics()] == list(range(1, STEPS + 1))
    assert_no_uncommitted(storage_dir, "retry")


class _KillTrialDriverAt(train.Callback):
    """Runs in the trial's actor (the Train driver): ends that process at ``step``.

    Only in the trial's first attempt, so Tune's retry can finish the trial.
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def on_report(self, metrics: dict[str, Any], checkpoint: train.Checkpoint | None) -> None:
        if metrics.get("step") == self.step and tune.get_context().get_attempt() == 0:
            os._exit(1)  # the trial's actor dies: a driver failure for the Train run


def _trial_with_driver_failure(config: dict[str, Any]) -> None:
    TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"x": config["x"], "steps": STEPS},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(callbacks=[_KillTrialDriverAt(CRASH_AT)]),
    ).fit()


def test_trial_driver_failure_is_retried_by_tune_and_resumes_the_train_run(
    ray_cluster: str, storage_dir: str
) -> None:
    grid = tune.Tuner(
        _trial_with_driver_failure,
        param_space={"x": 1.0},
        tune_config=tune.TuneConfig(metric="loss", mode="min", trial_resources={"CPU": 0}),
        run_config=tune.RunConfig(
            name="driver-retry",
            storage_path=storage_dir,
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED", result.error
    assert len(result.errors) == 1  # the lost trial actor, retried once by Tune
    assert result.metrics["step"] == STEPS
    assert result.metrics["resumed_from"] == CRASH_AT  # the Train run's own checkpoint

    run = nested_runs(storage_dir, "driver-retry")[result.trial_name]
    state = run.load_state()
    assert state is not None
    assert state.status == "finished"
    assert len(state.attempts) == 2
    assert [row["step"] for row in run.read_metrics()] == list(range(1, STEPS + 1))
    assert_no_uncommitted(storage_dir, "driver-retry")
    # ray_cluster's teardown: the dead trial's Train workers and placement group are gone
