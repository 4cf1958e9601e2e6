"""Pruning through Train: a pruned trial's TorchTrainer stops its workers; the trial ends PRUNED."""

from __future__ import annotations

import optuna
import workloads
from it_helpers import assert_no_uncommitted, nested_run

from lumos import train, tune
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

MAX_STEPS = 3000  # a pruned run must stop far earlier
GOOD_STEPS = 5


def _trial(config: dict[str, float]) -> None:
    # Nothing Tune-specific: the run finds its trial through lumos.runtime's job context.
    max_steps = GOOD_STEPS if config["loss"] < 1.0 else MAX_STEPS
    TorchTrainer(
        workloads.report_steps,
        train_loop_config={"loss": config["loss"], "max_steps": max_steps},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def test_pruned_trial_stops_its_train_workers(ray_cluster: str, storage_dir: str) -> None:
    # ThresholdPruner: deterministic, prunes the first report above 1.0.
    grid = tune.Tuner(
        _trial,
        param_space={"loss": tune.choice([0.5, 5.0])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=2,
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            points_to_evaluate=[{"loss": 0.5}, {"loss": 5.0}],
            pruner=optuna.pruners.ThresholdPruner(upper=1.0),
        ),
        run_config=tune.RunConfig(name="prune", storage_path=storage_dir, verbose=0),
    ).fit()

    by_loss = {r.config["loss"]: r for r in grid}
    good, bad = by_loss[0.5], by_loss[5.0]
    assert good.status == "TERMINATED", good.error
    assert good.metrics["step"] == GOOD_STEPS
    assert bad.status == "PRUNED", bad.error
    assert grid.num_errors == 0

    experiment = RunStorage(storage_dir, "prune")
    bad_run = nested_run(experiment, bad.trial_name)
    state = bad_run.load_state()
    assert state is not None
    assert state.status == "aborted"  # stopped by its trial, not finished, not errored
    steps = [row["step"] for row in bad_run.read_metrics()]
    assert 1 <= len(steps) < MAX_STEPS
    assert steps == list(range(1, len(steps) + 1))
    good_state = nested_run(experiment, good.trial_name).load_state()
    assert good_state is not None
    assert good_state.status == "finished"
    assert_no_uncommitted(storage_dir, "prune")
    # ray_cluster's teardown: no worker actor or placement group left alive
