"""Local mode (``num_workers=0``) runs validations, health checks with rollback, and datasets.

The same run core as the Ray controller (``controller/core.py``): the behaviours of
test_health.py on ``FakeCluster``, here with the function in the calling thread and
validations in threads of this process (test_health.py runs a validation-triggered
rollback on both backends). Under torchrun: test_local_mode.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import data_fns
import health_fns
import pytest

from lumos import train
from lumos.storage import RunStorage


def _local(
    tmp_path: Path, config: dict[str, Any], validate: bool = False, **run_kwargs: Any
) -> train.DataParallelTrainer:
    run_kwargs.setdefault("verbose", False)
    return train.DataParallelTrainer(
        health_fns.loop,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(name="run", storage_path=str(tmp_path), **run_kwargs),
        validation_config=train.ValidationConfig(health_fns.validate) if validate else None,
    )


def _state(tmp_path: Path) -> Any:
    state = RunStorage(str(tmp_path), "run").load_state()
    assert state is not None
    return state


def test_validation_merges_metrics_and_retention_keeps_the_best(tmp_path: Path) -> None:
    log = str(tmp_path / "log.jsonl")
    result = _local(
        tmp_path,
        {"steps": 5, "validate": True, "log": log, "wait_validated": True},
        validate=True,
        checkpoint_config=train.CheckpointConfig(
            num_to_keep=1, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
        ),
    ).fit()
    best = [(Path(c.path).name, m["val_loss"]) for c, m in result.best_checkpoints]
    assert best == [("step=2", 0.0), ("step=4", 2.0)]  # the best, and the latest
    assert [row.get("val_loss") for row in result.metrics_history] == [2.0, 1.0, 0.0, 1.0, 2.0]
    # get_all_reported_checkpoints(VALIDATED) waited for the last one
    (seen,) = [r["seen"] for r in health_fns.read_log(log) if "seen" in r]
    assert [status for _, status in seen] == ["VALIDATED", "VALIDATED"]


def test_a_failing_or_slow_validation_is_recorded_and_training_goes_on(tmp_path: Path) -> None:
    result = _local(
        tmp_path,
        {"steps": 3, "validate": {"fn_kwargs": {"fail_step": 1}, "timeout_s": 30}},
        validate=True,
    ).fit()
    assert result.metrics["step"] == 2
    records = {r.dir_name: r for r in _state(tmp_path).checkpoints}
    assert records["step=1"].validation_status == "failed"
    assert "cannot load step 1" in (records["step=1"].validation_error or "")
    assert records["step=2"].validation_status == "validated"


def test_nan_rolls_back_to_the_checkpoint_before_it_and_the_run_finishes(tmp_path: Path) -> None:
    log = str(tmp_path / "log.jsonl")
    checks = [train.NonFiniteMetric("loss")]
    result = _local(tmp_path, {"steps": 8, "nan_at": 5, "log": log}, health_checks=checks).fit()
    assert [row["step"] for row in result.metrics_history] == list(range(8))
    assert all(math.isfinite(row["loss"]) for row in result.metrics_history)
    starts = [r for r in health_fns.read_log(log) if "start" in r]
    assert [(s["start"], s["attempt"]) for s in starts] == [(0, 0), (5, 1)]
    info = starts[1]["info"]
    assert (info["from_report"], info["to_checkpoint"], info["number"]) == (5, "step=4", 1)
    state = _state(tmp_path)
    assert [a.status for a in state.attempts] == ["rolled_back", "finished"]
    assert state.status == "finished"


def test_a_check_that_raises_fails_the_run_clearly(tmp_path: Path) -> None:
    def broken(report: train.HealthReport, history: Any) -> None:
        raise ZeroDivisionError("oops")

    with pytest.raises(train.TrainingFailedError, match=r"health check .*broken raised"):
        _local(tmp_path, {"steps": 2}, health_checks=[broken]).fit()
    assert _state(tmp_path).status == "errored"


def test_a_rerun_runs_the_validations_left_pending_again(tmp_path: Path) -> None:
    class StopAtFirstCommit(train.Callback):
        def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
            if checkpoint is not None:
                raise KeyboardInterrupt  # Ctrl-C while the validation still runs

    slow = train.ValidationTaskConfig({"sleep_s": 1.0})
    first = train.DataParallelTrainer(
        health_fns.loop,
        train_loop_config={"steps": 2, "validate": True},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(
            name="run", storage_path=str(tmp_path), verbose=False, callbacks=[StopAtFirstCommit()]
        ),
        validation_config=train.ValidationConfig(health_fns.validate, task_config=slow),
    )
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    state = _state(tmp_path)
    assert state.status == "aborted"
    assert [c.validation_status for c in state.checkpoints] == ["pending"]
    result = _local(tmp_path, {"steps": 2, "validate": True}, validate=True).fit()
    assert [c.validation_status for c in _state(tmp_path).checkpoints] == ["validated"] * 2
    assert result.metrics["step"] == 1


def test_datasets_feed_the_one_rank_whole(tmp_path: Path, ray_cluster: str) -> None:
    import ray.data

    out = tmp_path / "out"
    out.mkdir()
    datasets = {"train": ray.data.from_items([{"id": i} for i in range(20)])}
    train.DataParallelTrainer(
        data_fns.shard_rows,
        train_loop_config={"names": ["train"], "out": str(out), "epochs": 2},
        datasets=datasets,
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(name="data", storage_path=str(tmp_path), verbose=False),
    ).fit()
    seen = json.loads((out / "rank0.json").read_text())
    assert [sorted(epoch) for epoch in seen["train"]] == [list(range(20))] * 2
