"""Tune over Train with a Hugging Face Trainer: a pruned trial's HF run stops cleanly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hf_workloads
import optuna
import pytest
from it_helpers import assert_no_uncommitted, nested_run

from lumos import train, tune
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytest.importorskip("transformers")

MAX_STEPS = 2000  # a pruned run must stop far earlier
GOOD_STEPS = 4


def _trial(config: dict[str, Any]) -> None:
    scale = config["loss_scale"]
    TorchTrainer(
        hf_workloads.hf_scaled_loss,
        train_loop_config={
            "loss_scale": scale,
            "max_steps": GOOD_STEPS if scale < 10 else MAX_STEPS,
            "save_steps": 2,
            "hf_dir": config["hf_dir"],
        },
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def test_pruned_hf_trial_stops_its_trainer(
    ray_cluster: str, storage_dir: str, tmp_path: Path
) -> None:
    # The tiny model's loss is about 0.7 (two labels); scaled by 100 the first
    # report is above the threshold, so ThresholdPruner prunes that trial at once.
    hf_dir = str(tmp_path / "hf")
    grid = tune.Tuner(
        _trial,
        param_space={"loss_scale": tune.choice([1.0, 100.0]), "hf_dir": hf_dir},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=2,
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            points_to_evaluate=[
                {"loss_scale": 1.0, "hf_dir": hf_dir},
                {"loss_scale": 100.0, "hf_dir": hf_dir},
            ],
            pruner=optuna.pruners.ThresholdPruner(upper=10.0),
        ),
        run_config=tune.RunConfig(name="hfprune", storage_path=storage_dir, verbose=0),
    ).fit()

    by_scale = {r.config["loss_scale"]: r for r in grid}
    good, bad = by_scale[1.0], by_scale[100.0]
    assert good.status == "TERMINATED", good.error
    assert good.metrics["step"] == GOOD_STEPS
    assert "train_loss" in good.metrics  # the HF Trainer's summary, the run's last report
    assert bad.status == "PRUNED", bad.error
    assert grid.num_errors == 0

    experiment = RunStorage(storage_dir, "hfprune")
    bad_run = nested_run(experiment, bad.trial_name)
    state = bad_run.load_state()
    assert state is not None
    assert state.status == "aborted"  # stopped by its trial: not finished, not errored
    steps = [row["step"] for row in bad_run.read_metrics()]
    assert 1 <= len(steps) < 50
    assert steps == list(range(1, len(steps) + 1))  # one report per HF step
    good_run = nested_run(experiment, good.trial_name)
    good_state = good_run.load_state()
    assert good_state is not None
    assert good_state.status == "finished"
    assert [c.dir_name for c in good_state.checkpoints] == ["checkpoint-2", "checkpoint-4"]
    assert_no_uncommitted(storage_dir, "hfprune")
