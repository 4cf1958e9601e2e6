"""Tune over Train: the trial's checkpoint is its Train run's, the run knows its trial,
a Tune retry keeps the trial's history where the run resumes, and population-based
training restarts the exploited trial's Train run from the cloned checkpoint.

Every Train run has 1 worker (the machine has few CPUs); the trials' own actors take none.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import optuna
import tot_workloads

from lumos import train, tune
from lumos.train.torch import TorchTrainer


def _trial(config: dict[str, Any]) -> None:
    callbacks = [_KillTrialActorAt(config["kill_at"])] if config.get("kill_at") else []
    TorchTrainer(
        tot_workloads.learner,
        train_loop_config=dict(config),
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(callbacks=callbacks),
    ).fit()


class _KillTrialActorAt(train.Callback):
    """In the trial's actor (the Train driver): ends that process at ``step`` of attempt 0."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_report(self, metrics: dict[str, Any], checkpoint: train.Checkpoint | None) -> None:
        if metrics.get("step") == self.step and tune.get_context().get_attempt() == 0:
            os._exit(1)


def _step_of(checkpoint: tune.Checkpoint) -> int:
    with checkpoint.as_directory() as d, open(os.path.join(d, tot_workloads.STEP_FILE)) as f:
        return int(json.load(f)[1])


def test_the_trial_returns_its_train_runs_checkpoint_and_the_run_names_its_trial(
    ray_cluster: str, storage_dir: str
) -> None:
    grid = tune.Tuner(
        _trial,
        param_space={"lr": 0.5, "steps": 3},
        tune_config=tune.TuneConfig(metric="score", mode="max", trial_resources={"CPU": 0}),
        run_config=tune.RunConfig(name="tot", storage_path=storage_dir, verbose=0),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED", result.error
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/train/step=3")
    assert _step_of(result.checkpoint) == 3
    assert result.metrics["trial_name"] == result.trial_name
    assert result.metrics["trial_id"] == result.trial_id
    assert result.metrics["trial_dir"].rstrip("/") == result.path.rstrip("/")


def test_a_tune_retry_keeps_the_trial_history_where_the_train_run_resumes(
    ray_cluster: str, storage_dir: str
) -> None:
    grid = tune.Tuner(
        _trial,
        param_space={"lr": 0.5, "steps": 4, "kill_at": 2},
        tune_config=tune.TuneConfig(metric="score", mode="max", trial_resources={"CPU": 0}),
        run_config=tune.RunConfig(
            name="tot-retry",
            storage_path=storage_dir,
            failure_config=tune.FailureConfig(max_failures=1),
            verbose=0,
        ),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED", result.error
    assert len(result.errors) == 1  # the trial's actor died once; Tune retried it
    assert result.metrics["resumed_from"] == 2  # the Train run resumed from its own commit
    df = result.metrics_dataframe
    # every step once, at the iteration the pruner saw it: no gap, no duplicate
    assert list(df["step"]) == [1, 2, 3, 4]
    assert list(df["training_iteration"]) == [1, 2, 3, 4]
    assert _step_of(result.checkpoint) == 4


STEPS_PBT = 8


def test_pbt_restarts_the_exploited_trials_train_run_from_the_clone(
    ray_cluster: str, storage_dir: str, tmp_path: Any
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    pbt = tune.PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [2.0]},
        quantile_fraction=0.5,
        resample_probability=1.0,
        seed=0,
    )
    grid = tune.Tuner(
        _trial,
        param_space={
            "lr": tune.choice([0.1, 1.0]),
            "steps": STEPS_PBT,
            "gate": str(gate),
            "trials": 2,
        },
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            num_samples=2,
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            sampler=optuna.samplers.RandomSampler(seed=0),
            points_to_evaluate=[{"lr": 0.1}, {"lr": 1.0}],
            scheduler=pbt,
        ),
        run_config=tune.RunConfig(name="tot-pbt", storage_path=storage_dir, verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    checked = 0
    for trial in grid:
        if not trial.exploits:
            continue
        first = trial.exploits[0]
        end = trial.exploits[1].step if len(trial.exploits) > 1 else STEPS_PBT
        # the donor's latest checkpoint was its Train run's (its first or a later one)
        match = re.fullmatch(r"train(-pbt\d+)?/step=(\d+)", first.donor_checkpoint)
        assert match is not None, first
        donor_step = int(match.group(2))
        df = trial.metrics_dataframe
        after = df[(df["training_iteration"] > first.step) & (df["training_iteration"] <= end)]
        if after.empty:
            continue  # cloned at its last step: nothing ran after the clone
        # a fresh Train run started from the clone (the donor's step), with the new config
        assert set(after["resumed_from"]) == {donor_step}
        assert int(after["step"].iloc[0]) == donor_step + 1
        assert set(after["lr"]) == {first.new_config["lr"]}
        checked += 1
    assert checked, [(r.config, r.exploits) for r in grid]
    slow = next(r for r in grid if r.exploits and r.exploits[0].old_config["lr"] == 0.1)
    assert slow.checkpoint is not None
    assert f"/train-pbt{len(slow.exploits)}/" in slow.checkpoint.path
    assert _step_of(slow.checkpoint) == STEPS_PBT
