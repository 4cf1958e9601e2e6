"""Pruning through Train: a pruned trial's TorchTrainer stops its workers; the trial ends PRUNED."""

from __future__ import annotations

import workloads
from it_helpers import assert_pruned_run_stopped, sweep_good_and_bad

from lumos import train
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
    _, good, bad = sweep_good_and_bad(
        _trial, "prune", storage_dir, key="loss", good=0.5, bad=5.0, metric="loss", upper=1.0
    )
    assert good.metrics["step"] == GOOD_STEPS
    _, bad_run = assert_pruned_run_stopped(storage_dir, "prune", good, bad)
    steps = [row["step"] for row in bad_run.read_metrics()]
    assert 1 <= len(steps) < MAX_STEPS
    assert steps == list(range(1, len(steps) + 1))
    # ray_cluster's teardown: no worker actor or placement group left alive
