"""The demo (examples/demo_tune_over_train.py) at small scale, with its own code.

Trials run one at a time so that the successive-halving decisions are
deterministic: a good configuration reaches the first rung (epoch 2) first, and a
bad one that reaches it later is pruned there.
"""

from __future__ import annotations

import demo_tune_over_train as demo
import digits
import pytest
from it_helpers import assert_no_uncommitted, nested_runs

EPOCHS = 5  # the pruner's first rung is epoch 2, its second (epoch 6) is never reached
GOOD = {"lr": 0.01, "width": 128, "batch_size": 32}
BAD = {"lr": 0.001, "width": 16, "batch_size": 128}


def test_small_demo_sweep(ray_cluster: str, storage_dir: str) -> None:
    outcome = demo.run_sweep(
        num_samples=3,
        epochs=EPOCHS,
        storage_path=storage_dir,
        name="digits",
        max_concurrent_trials=1,
        verbose=0,
        points_to_evaluate=[GOOD, BAD],
    )
    grid = outcome.grid
    assert len(grid) == 3
    assert grid.num_errors == 0, grid.errors

    runs = nested_runs(storage_dir, "digits")
    # every trial drove one Train run; its history is one row per epoch it trained
    epochs_run = {r.trial_name: len(runs[r.trial_name].read_metrics()) for r in grid}
    by_config = {(r.config["lr"], r.config["width"], r.config["batch_size"]): r for r in grid}
    good = by_config[(GOOD["lr"], GOOD["width"], GOOD["batch_size"])]
    bad = by_config[(BAD["lr"], BAD["width"], BAD["batch_size"])]
    assert good.status == "TERMINATED"
    assert bad.status == "PRUNED"

    completed = [r for r in grid if r.status == "TERMINATED"]
    pruned = [r for r in grid if r.status == "PRUNED"]
    for r in completed:
        assert epochs_run[r.trial_name] == EPOCHS
        assert r.metrics["epoch"] == EPOCHS
    for r in pruned:
        assert 2 <= epochs_run[r.trial_name] < EPOCHS
        # the trial saw its Train run's epochs as they happened, up to the pruning
        # decision at the first rung (an epoch that ended after it may not reach it)
        seen = list(r.metrics_dataframe["epoch"])
        assert len(seen) >= 2
        assert seen == [row["epoch"] for row in runs[r.trial_name].read_metrics()][: len(seen)]
        state = runs[r.trial_name].load_state()
        assert state is not None
        assert state.status == "aborted"
    assert max(epochs_run[r.trial_name] for r in pruned) < min(
        epochs_run[r.trial_name] for r in completed
    )

    # the best trial's checkpoint loads and reproduces the accuracy it reported
    best = outcome.best
    assert best.status == "TERMINATED"
    model, epoch = digits.load_model(outcome.checkpoint)
    assert epoch == best.metrics["epoch"] == EPOCHS
    splits = digits.load_splits()
    reproduced = digits.accuracy(model, splits.x_val, splits.y_val)
    assert reproduced == pytest.approx(best.metrics["val_accuracy"], abs=1e-12)
    assert digits.evaluate_checkpoint(outcome.checkpoint) >= 0.9

    # a pruned run stopped mid-upload must not leave its unfinished checkpoint behind
    assert_no_uncommitted(storage_dir, "digits")
