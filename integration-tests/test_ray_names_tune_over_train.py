"""Ray's ``ray.tune.integration.ray_train.TuneReportCallback`` on lumos: a TorchTrainer in a
trial takes it in ``train.RunConfig(callbacks=...)``; each of its reports reaches the trial
once (lumos forwards them anyway), with ``checkpoint_path`` as Ray's callback adds it."""

from __future__ import annotations

from typing import Any

import tot_workloads

from lumos import train, tune
from lumos.train.torch import TorchTrainer
from lumos.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback


def _trial(config: dict[str, Any]) -> None:
    callbacks = [TuneReportCallback()] if config["callback"] else []
    assert all(isinstance(cb, train.Callback) for cb in callbacks)
    TorchTrainer(
        tot_workloads.learner,
        train_loop_config={"lr": 1.0, "steps": 3},
        scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(callbacks=callbacks, verbose=False),
    ).fit()


def test_tune_report_callback_adds_checkpoint_path_and_reports_once(
    ray_cluster: str, storage_dir: str
) -> None:
    grid = tune.Tuner(
        _trial,
        param_space={"callback": tune.grid_search([True, False])},
        tune_config=tune.TuneConfig(
            metric="score", mode="max", trial_resources={"CPU": 0}, max_concurrent_trials=1
        ),
        run_config=tune.RunConfig(name="tot-names", storage_path=storage_dir, verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    by_callback = {r.config["callback"]: r for r in grid}
    with_cb, without = by_callback[True], by_callback[False]
    for result in (with_cb, without):
        rows = result.metrics_dataframe
        assert list(rows["step"]) == [1, 2, 3]  # each Train report reached the trial once
        assert list(rows["training_iteration"]) == [1, 2, 3]
        assert result.checkpoint is not None
        assert result.checkpoint.path.endswith("/train/step=3")
    paths = list(with_cb.metrics_dataframe[CHECKPOINT_PATH_KEY])
    assert [p.rsplit("/", 2)[-2:] for p in paths] == [["train", f"step={i}"] for i in (1, 2, 3)]
    assert with_cb.metrics[CHECKPOINT_PATH_KEY] == with_cb.checkpoint.uri
    assert with_cb.filesystem.isdir(with_cb.metrics[CHECKPOINT_PATH_KEY])
    assert CHECKPOINT_PATH_KEY not in without.metrics  # lumos's own forwarding adds none
