"""Health checks, health rollback and validation without Ray (FakeCluster, threads).

The same behaviours on a real Ray cluster are in test_ray_health.py.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import health_fns
import pytest
from conftest import run_config
from fake_runs import make, states

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage
from lumos.train._internal.controller.health_monitor import HealthCheckError, HealthMonitor
from lumos.train._internal.controller.validations import ValidationRunner

# -- the checks ---------------------------------------------------------------------------


def test_non_finite_metric_fires_on_nan_and_inf_only() -> None:
    check = train.NonFiniteMetric("loss")
    assert check(train.HealthReport(0, {"loss": 1.0}), []) is None
    assert check(train.HealthReport(0, {"acc": math.nan}), []) is None  # no such metric
    assert check(train.HealthReport(0, {"loss": "nan"}), []) is None  # not a number
    fired = check(train.HealthReport(3, {"loss": math.inf}), [])
    assert fired is not None
    assert fired.reason == "loss=inf is not finite (report #3)"
    assert fired.to_checkpoint is None


def test_metric_spike_waits_for_a_full_window_then_compares_with_the_median() -> None:
    check = train.MetricSpike("loss", factor=2.0, window=3)
    history = [train.HealthReport(i, {"loss": v}) for i, v in enumerate([1.0, 5.0])]
    assert check(train.HealthReport(2, {"loss": 100.0}), history) is None  # window not full
    history.append(train.HealthReport(2, {"loss": 1.5}))
    assert check(train.HealthReport(3, {"loss": 2.9}), history) is None  # median 1.5 x 2 = 3
    fired = check(train.HealthReport(3, {"loss": 3.1}), history)
    assert fired is not None
    assert "median 1.5 over the last 3 reports" in fired.reason


@pytest.mark.parametrize(
    ("make_check", "words"),
    [
        (lambda: train.MetricSpike("loss", factor=1.0), ["factor=1.0", "> 1"]),
        (lambda: train.MetricSpike("loss", window=0), ["window=0", ">= 1"]),
        (lambda: train.NonFiniteMetric(""), ["metric=''", "non-empty"]),
        (lambda: train.RunConfig(health_checks=[3]), ["health_checks[0]=3", "not callable"]),
        (lambda: train.RunConfig(health_checks="loss"), ["health_checks='loss'", "list"]),
        (lambda: train.FailureConfig(max_rollbacks=-2), ["max_rollbacks=-2", "-1 (unlimited)"]),
        (lambda: train.ValidationTaskConfig(timeout_s=0), ["timeout_s=0", "> 0"]),
        (lambda: train.ValidationTaskConfig(fn_kwargs={"x": object()}), ["JSON"]),
        (lambda: train.ValidationConfig(fn=3), ["fn=3", "callable"]),
        (
            lambda: train.ValidationConfig(print, ray_remote_kwargs={"num_cpu": 1}),
            ["ray_remote_kwargs={'num_cpu': 1}", "Invalid option keyword num_cpu"],
        ),
    ],
)
def test_bad_health_and_validation_settings_are_clear(make_check: Any, words: list[str]) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        make_check()
    for word in words:
        assert word in str(info.value)


def test_monitor_keeps_history_per_source_and_rewinds() -> None:
    seen: list[list[int]] = []

    def spy(report: train.HealthReport, history: Any) -> None:
        seen.append([h.index for h in history])

    monitor = HealthMonitor([spy], history=[{"loss": 1.0}, {"loss": 2.0}])
    assert monitor.on_report(2, {"loss": 3.0}) is None
    assert monitor.on_validation(1, {"val": 1.0}, "c1") is None
    assert monitor.on_report(3, {"loss": 3.0}) is None
    monitor.rewind(2)
    assert monitor.on_report(2, {"loss": 3.0}) is None
    assert seen == [[0, 1], [], [0, 1, 2], [0, 1]]


def test_a_check_that_raises_or_returns_garbage_is_a_clear_error() -> None:
    def broken(report: train.HealthReport, history: Any) -> None:
        raise KeyError("loss")

    with pytest.raises(HealthCheckError, match="broken raised KeyError"):
        HealthMonitor([broken]).on_report(0, {})
    with pytest.raises(HealthCheckError, match="returned True"):
        HealthMonitor([lambda r, h: True]).on_report(0, {})


# -- the validation runner ------------------------------------------------------------------


class _ManualLauncher:
    """Validations that end when the test says so."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.futures: dict[str, Future[dict[str, Any]]] = {}

    def launch(self, checkpoint: Any, fn_kwargs: dict[str, Any]) -> Any:
        future: Future[dict[str, Any]] = Future()
        self.launched.append((checkpoint, fn_kwargs))
        self.futures[checkpoint] = future
        return future

    def done(self, handles: list[Any], timeout_s: float) -> list[Any]:
        return [h for h in handles if h.done()]

    def result(self, handle: Any) -> dict[str, Any]:
        value: dict[str, Any] = handle.result()
        return value

    def cancel(self, handle: Any) -> None:
        name = next(k for k, f in self.futures.items() if f is handle)
        self.cancelled.append(name)


def test_runner_runs_two_at_a_time_in_order_and_times_out() -> None:
    now = [0.0]
    launcher = _ManualLauncher()
    runner = ValidationRunner(launcher, max_in_flight=2, clock=lambda: now[0])
    for i in range(3):
        runner.submit(i, f"c{i}", f"c{i}", {"fn_kwargs": {"i": i}, "timeout_s": 10.0})  # type: ignore[arg-type]
    assert [c for c, _ in launcher.launched] == ["c0", "c1"]
    launcher.futures["c1"].set_result({"val": 1})
    now[0] = 1.0
    (outcome,) = runner.poll()
    assert (outcome.dir_name, outcome.status, outcome.metrics) == ("c1", "validated", {"val": 1})
    assert [c for c, _ in launcher.launched] == ["c0", "c1", "c2"]  # the freed slot
    now[0] = 10.5
    (outcome,) = runner.poll()
    assert (outcome.dir_name, outcome.status) == ("c0", "timeout")
    assert "timeout_s=10" in (outcome.error or "")
    assert launcher.cancelled == ["c0"]
    launcher.futures["c2"].set_exception(ValueError("bad weights"))
    now[0] = 10.9  # c2 started at 1.0: not timed out yet
    (outcome,) = runner.poll()
    assert (outcome.status, outcome.error) == ("failed", "ValueError: bad weights")
    assert runner.pending == 0


def test_runner_cancels_rolled_back_validations() -> None:
    launcher = _ManualLauncher()
    runner = ValidationRunner(launcher, max_in_flight=1, clock=lambda: 0.0)
    for i in range(3):
        runner.submit(i, f"c{i}", f"c{i}", {})  # type: ignore[arg-type]
    assert sorted(runner.cancel({"c0", "c2"})) == ["c0", "c2"]
    assert launcher.cancelled == ["c0"]
    assert [c for c, _ in launcher.launched] == ["c0", "c1"]
    assert runner.pending == 1


# -- runs on the fake cluster ----------------------------------------------------------------


def _trainer(
    tmp_path: Path, cluster: FakeCluster | None, config: dict[str, Any], **run_kwargs: Any
) -> train.DataParallelTrainer:
    """Two ranks on ``cluster`` (the Ray controller), or local mode when it is ``None``."""
    validation = run_kwargs.pop("validation_config", None)
    if cluster is None:
        trainer = train.DataParallelTrainer(
            health_fns.loop,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=run_config(tmp_path, **run_kwargs),
        )
    else:
        trainer = make(health_fns.loop, config, tmp_path, cluster, **run_kwargs)
    trainer.validation_config = validation
    return trainer


def test_nan_rolls_back_to_the_checkpoint_before_it_and_the_run_finishes(tmp_path: Path) -> None:
    log = str(tmp_path / "log.jsonl")
    config = {"steps": 8, "nan_at": 5, "log": log}
    checks = [train.NonFiniteMetric("loss")]
    result = _trainer(tmp_path, FakeCluster(), config, health_checks=checks).fit()
    assert [row["step"] for row in result.metrics_history] == list(range(8))
    assert all(math.isfinite(row["loss"]) for row in result.metrics_history)
    starts = [r for r in health_fns.read_log(log) if "start" in r]
    assert [s["start"] for s in starts] == [0, 5]
    info = starts[1]["info"]
    assert info["from_report"] == 5
    assert (info["to_checkpoint"], info["to_report_index"]) == ("step=4", 4)
    assert info["check"] == "NonFiniteMetric('loss')"
    assert info["number"] == 1
    assert starts[0]["info"] is None
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["rolled_back", "finished"]
    assert len(state.rollbacks) == 1
    assert state.rollbacks[0].rolled_back == []  # step=5 never committed


def test_custom_check_names_its_checkpoint_and_reported_names_are_reused(tmp_path: Path) -> None:
    fired: list[int] = []

    def back_to_step_1(report: train.HealthReport, history: Any) -> train.Rollback | None:
        if report.index == 4 and not fired:
            fired.append(report.index)
            return train.Rollback("step 4 looks wrong", to_checkpoint="step=1")
        return None

    log = str(tmp_path / "log.jsonl")
    result = _trainer(
        tmp_path,
        FakeCluster(),
        {"steps": 6, "log": log},
        health_checks=[back_to_step_1],
        checkpoint_config=train.CheckpointConfig(num_to_keep=10),
    ).fit()
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    # step=2 and step=3 were rolled back and renamed; the resumed run reported them again
    assert state.rollbacks[0].rolled_back == ["step=2.rolled-back-1", "step=3.rolled-back-1"]
    live = [r.dir_name for r in state.live_checkpoints()]
    assert live == ["step=0", "step=1", "step=2", "step=3", "step=4", "step=5"]
    assert [r.dir_name for r in state.checkpoints if r.rolled_back] == [
        "step=2.rolled-back-1",
        "step=3.rolled-back-1",
    ]
    assert len(result.best_checkpoints) == 6  # rolled back ones are not "best"
    starts = [r["start"] for r in health_fns.read_log(log) if "start" in r]
    assert starts == [0, 2]


def test_max_rollbacks_exhausted_is_a_clear_error(tmp_path: Path) -> None:
    always = [train.MetricSpike("loss", factor=1.5, window=2)]
    config = {"steps": 6, "losses": [1.0, 1.0, 1.0, 9.0, 9.0, 9.0]}
    trainer = _trainer(
        tmp_path,
        FakeCluster(),
        config,
        health_checks=always,
        failure_config=train.FailureConfig(max_rollbacks=1),
    )
    with pytest.raises(train.TrainingFailedError) as info:
        trainer.fit()
    message = str(info.value)
    assert "MetricSpike('loss', factor=1.5, window=2) fired on report #3" in message
    assert "max_rollbacks=1" in message
    assert states(trainer)[-2:] == ["rollingback", "errored"]  # the second one: no budget
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert len(state.rollbacks) == 1


def test_validation_merges_metrics_and_retention_keeps_the_best(tmp_path: Path) -> None:
    trainer = _trainer(
        tmp_path,
        FakeCluster(),
        {"steps": 5, "validate": True},
        checkpoint_config=train.CheckpointConfig(
            num_to_keep=1, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
        ),
        validation_config=train.ValidationConfig(health_fns.validate),
    )
    result = trainer.fit()
    best = [(Path(c.path).name, m["val_loss"]) for c, m in result.best_checkpoints]
    assert best == [("step=2", 0.0), ("step=4", 2.0)]  # the best, and the latest
    history = result.metrics_history
    assert [row.get("val_loss") for row in history] == [2.0, 1.0, 0.0, 1.0, 2.0]


def test_validation_without_a_validation_config_is_a_clear_error(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, FakeCluster(), {"steps": 2, "validate": True})
    with pytest.raises(train.TrainingFailedError) as info:
        trainer.fit()
    assert "validation_config=train.ValidationConfig(fn)" in str(info.value.worker_errors)


@pytest.mark.parametrize("backend", ["controller", "local"])
def test_a_check_on_validation_results_rolls_back_to_its_named_checkpoint(
    tmp_path: Path, backend: str
) -> None:
    log = str(tmp_path / "log.jsonl")
    trainer = _trainer(
        tmp_path,
        FakeCluster() if backend == "controller" else None,
        {"steps": 6, "validate": True, "log": log, "step_s": 0.05},
        health_checks=[health_fns.val_spike],
        validation_config=train.ValidationConfig(health_fns.validate),
        failure_config=train.FailureConfig(max_rollbacks=1),
    )
    with pytest.raises(train.TrainingFailedError, match="max_rollbacks=1"):
        trainer.fit()  # step 4 validates the same way after the rollback: fires again
    starts = [r for r in health_fns.read_log(log) if "start" in r]
    assert starts[1]["start"] == 2
    assert starts[1]["info"]["to_checkpoint"] == "step=1"
    assert starts[1]["info"]["check"] == "val_spike"
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.status == "errored"
    assert [a.status for a in state.attempts] == ["rolled_back", "errored"]
    assert "max_rollbacks=1" in (state.attempts[-1].error or "")
