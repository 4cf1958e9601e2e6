"""Async validation and health rollback on a real Ray cluster, with real torch workers."""

from __future__ import annotations

import math
from pathlib import Path

import health_fns
import pytest
from conftest import run_config
from drivers import kill_driver, start_driver, wait_for_state

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_validations_merge_fail_time_out_and_rank_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "log.jsonl")
    task = train.ValidationTaskConfig(
        fn_kwargs={"fail_step": 3, "sleep_s": 120, "slow_step": 4}, timeout_s=3
    )
    result = TorchTrainer(
        health_fns.loop,
        train_loop_config={"steps": 6, "validate": True, "log": log, "wait_validated": True},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "validated",
            verbose=True,
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
        validation_config=train.ValidationConfig(
            health_fns.validate, task_config=task, ray_remote_kwargs={"num_cpus": 0.5}
        ),
    ).fit()
    # kept: the two best by val_loss (step=2: 0.0, step=1: 1.0) and the latest (step=5)
    best = {Path(c.path).name: m for c, m in result.best_checkpoints}
    assert sorted(best) == ["step=1", "step=2", "step=5"]
    assert [best[n]["val_loss"] for n in ("step=1", "step=2", "step=5")] == [1.0, 0.0, 3.0]
    assert best["step=2"]["loss"] == pytest.approx(1 / 3)  # merged, not replaced
    state = RunStorage(tmp_path, "validated").load_state()
    assert state is not None
    assert {r.dir_name: r.validation_status for r in state.checkpoints} == {
        "step=1": "validated",
        "step=2": "validated",
        "step=5": "validated",
    }
    history = {row["step"]: row.get("val_loss") for row in result.metrics_history}
    assert history == {0: 2.0, 1: 1.0, 2: 0.0, 3: None, 4: None, 5: 3.0}
    # rank 0's get_all_reported_checkpoints(VALIDATED) waited for step=5's validation
    (seen,) = [r["seen"] for r in health_fns.read_log(log) if "seen" in r]
    last_metrics, last_status = seen[-1]
    assert (last_metrics["step"], last_metrics["val_loss"], last_status) == (5, 3.0, "VALIDATED")
    err = capsys.readouterr().err
    assert (
        "validation of checkpoint 'step=3' failed: ValueError: validation cannot load step 3" in err
    )
    assert "validation of checkpoint 'step=4' timed out" in err


def test_nan_rolls_back_on_warm_workers_and_the_run_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "log.jsonl")
    result = TorchTrainer(
        health_fns.loop,
        train_loop_config={"steps": 8, "nan_at": 5, "log": log},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "nan", verbose=True, health_checks=[train.NonFiniteMetric("loss")]
        ),
    ).fit()
    assert [row["step"] for row in result.metrics_history] == list(range(8))
    assert all(math.isfinite(row["loss"]) for row in result.metrics_history)
    starts = [r for r in health_fns.read_log(log) if "start" in r]
    assert [s["start"] for s in starts] == [0, 5]
    assert starts[0]["pid"] == starts[1]["pid"]  # the workers stayed up
    info = starts[1]["info"]
    assert (info["from_report"], info["to_checkpoint"], info["check"]) == (
        5,
        "step=4",
        "NonFiniteMetric('loss')",
    )
    assert info["reason"] == "loss=nan is not finite (report #5)"
    err = capsys.readouterr().err
    assert "health check NonFiniteMetric('loss') fired on report #5" in err
    assert "rolling back (rollback 1 of 3) to checkpoint 'step=4'" in err
    assert "training resumed from checkpoint 'step=4'" in err


DRIVER = """
train.DataParallelTrainer(
    health_fns.loop,
    train_loop_config={{"steps": 3, "validate": True}},
    scaling_config=train.ScalingConfig(num_workers=2),
    run_config=train.RunConfig(name="pending", storage_path={path!r}),
    validation_config=train.ValidationConfig(
        health_fns.validate_slowly_until,
        task_config=train.ValidationTaskConfig(fn_kwargs={{"until": {until!r}}}),
    ),
).fit()
"""


def test_validations_pending_at_a_driver_sigkill_run_again_on_restore(
    tmp_path: Path, ray_cluster: str
) -> None:
    until = str(tmp_path / "validations-may-end")
    body = DRIVER.format(path=str(tmp_path), until=until)
    proc = start_driver(tmp_path, ray_cluster, "health_fns", body)
    storage = RunStorage(tmp_path, "pending")
    try:  # every checkpoint committed, its validation blocked on `until`
        wait_for_state(proc, storage, lambda s: len(s.checkpoints) == 3, "3 commits")
    finally:
        kill_driver(proc)
    state = storage.load_state()
    assert state is not None
    assert [r.validation_status for r in state.checkpoints] == ["pending"] * 3
    Path(until).touch()
    result = train.DataParallelTrainer(
        health_fns.loop,
        train_loop_config={"steps": 3, "validate": True},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="pending", storage_path=str(tmp_path), verbose=False),
        validation_config=train.ValidationConfig(health_fns.validate_slowly_until),
    ).fit()
    assert [m["val_loss"] for _, m in result.best_checkpoints] == [2.0, 1.0, 0.0]
    final = storage.load_state()
    assert final is not None
    assert [r.validation_status for r in final.checkpoints] == ["validated"] * 3
    assert final.status == "finished"
