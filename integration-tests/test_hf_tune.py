"""Tune over Train with a Hugging Face Trainer: a pruned trial's HF run stops cleanly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hf_workloads
import pytest
from it_helpers import assert_pruned_run_stopped, sweep_good_and_bad

from lumos import train
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


@pytest.mark.long  # plain nox: test_pruning, test_lightning_tune
def test_pruned_hf_trial_stops_its_trainer(
    ray_cluster: str, storage_dir: str, tmp_path: Path
) -> None:
    # The tiny model's loss is about 0.7 (two labels); scaled by 100 the first
    # report is above the threshold, so ThresholdPruner prunes that trial at once.
    hf_dir = str(tmp_path / "hf")
    _, good, bad = sweep_good_and_bad(
        _trial,
        "hfprune",
        storage_dir,
        key="loss_scale",
        good=1.0,
        bad=100.0,
        metric="loss",
        upper=10.0,
        constants={"hf_dir": hf_dir},
    )
    assert good.metrics["step"] == GOOD_STEPS
    assert "train_loss" in good.metrics  # the HF Trainer's summary, the run's last report
    good_run, bad_run = assert_pruned_run_stopped(storage_dir, "hfprune", good, bad)
    steps = [row["step"] for row in bad_run.read_metrics()]
    assert 1 <= len(steps) < 50
    assert steps == list(range(1, len(steps) + 1))  # one report per HF step
    good_state = good_run.load_state()
    assert good_state is not None
    assert [c.dir_name for c in good_state.checkpoints] == ["checkpoint-2", "checkpoint-4"]
