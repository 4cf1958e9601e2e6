"""Tuner end to end in-process (runtime's FakeWorkerPool runs trials in threads, no Ray)."""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Any

import optuna
import pytest

from lumos import tune
from lumos.runtime import context as job_context
from lumos.runtime.testing import FakeWorkerPool
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.progress import ConsoleReporter
from lumos.tune._internal.trial import Trial, TrialStatus


def fake_pool(resources: dict[str, float]) -> FakeWorkerPool:
    return FakeWorkerPool(resources)


def tuner(trainable: Any, tmp_path: Any, name: str = "exp", **kw: Any) -> tune.Tuner:
    run_kw = {
        k: kw.pop(k)
        for k in ("callbacks", "failure_config", "checkpoint_config", "verbose")
        if k in kw
    }
    run_kw.setdefault("verbose", 0)
    return tune.Tuner(
        trainable,
        param_space=kw.pop("param_space", {"x": tune.uniform(0, 1)}),
        tune_config=tune.TuneConfig(
            **{"metric": "loss", "mode": "min", "num_samples": 2, "max_concurrent_trials": 2, **kw}
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), **run_kw),
        _pool_factory=fake_pool,
    )


def _save_step(step: int, d: str) -> tune.Checkpoint:
    with open(os.path.join(d, "step"), "w") as f:
        f.write(str(step))
    return tune.Checkpoint.from_directory(d)


def test_retry_resumes_from_the_trials_last_checkpoint(tmp_path: Any) -> None:
    starts: list[int] = []

    def trainable(config: dict[str, Any]) -> None:
        start = 0
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "step")).read()) + 1
        starts.append(start)
        for step in range(start, 4):
            d = str(tmp_path / f"local-{tune.get_context().get_trial_name()}-{step}")
            os.makedirs(d)
            tune.report({"loss": 1.0 / (step + 1)}, checkpoint=_save_step(step, d))
            if step == 1 and ckpt is None:
                raise RuntimeError("flaky node")

    grid = tuner(
        trainable,
        tmp_path,
        num_samples=1,
        failure_config=tune.FailureConfig(max_failures=1),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
    ).fit()
    (result,) = list(grid)
    assert starts == [0, 2]
    assert result.status == "TERMINATED"
    assert result.error is None
    assert result.errors[0].exc_type == "RuntimeError"
    assert "flaky node" in result.errors[0].traceback
    assert result.metrics["training_iteration"] == 4
    assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3, 4]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_000004")
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "step")).read() == "3"
    # retention: only the latest checkpoint is kept in the trial directory
    kept = sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_"))
    assert kept == ["checkpoint_000004"]


def test_context_and_job_context_for_nested_jobs(tmp_path: Any) -> None:
    seen: dict[str, Any] = {}

    def trainable(config: dict[str, Any]) -> None:
        ctx = tune.get_context()
        job = job_context.current()
        assert job is not None
        seen.update(
            trial_id=ctx.get_trial_id(),
            name=ctx.get_trial_name(),
            dir=ctx.get_trial_dir(),
            exp=ctx.get_experiment_name(),
            kind=job.kind,
            job_name=job.name,
            job_path=job.storage_path,
            resources=ctx.get_trial_resources(),
        )
        # a nested job reports through the context; the trial sees it
        job.report({"loss": 0.25})

    grid = tuner(trainable, tmp_path, num_samples=1, trial_resources={"CPU": 0.5}).fit()
    assert seen["trial_id"] == "00000"
    assert seen["name"] == "trial_00000"
    assert seen["dir"] == str(tmp_path / "exp" / "trial_00000") == seen["job_path"] == grid[0].path
    assert (seen["kind"], seen["job_name"], seen["exp"]) == ("tune.trial", "trial_00000", "exp")
    assert seen["resources"] == {"CPU": 0.5}
    assert grid[0].metrics["loss"] == 0.25
    assert job_context.current() is None


def test_pruned_trial_raises_trial_pruned_and_nested_stop_event_is_set(tmp_path: Any) -> None:
    outcomes: dict[str, str] = {}

    def trainable(config: dict[str, Any]) -> None:
        name = tune.get_context().get_trial_name()
        job = job_context.current()
        assert job is not None
        bad = name == "trial_00001"
        try:
            for _ in range(3):
                tune.report({"loss": 10.0 if bad else 1.0})
                # a nested job waits on the event; the pruned trial's is set (bounded wait)
                if bad and job.stop_event.wait(60):
                    break
            tune.report({"loss": 10.0 if bad else 1.0})
        except tune.TrialPruned:
            outcomes[name] = "pruned"
            assert job.stop_event.is_set()
            assert isinstance(job.stop_error(), tune.TrialPruned)
            raise
        outcomes[name] = "done"

    grid = tuner(trainable, tmp_path, pruner=optuna.pruners.ThresholdPruner(upper=5.0)).fit()
    assert outcomes == {"trial_00000": "done", "trial_00001": "pruned"}
    assert [r.status for r in grid] == ["TERMINATED", "PRUNED"]
    assert grid[1].metrics["training_iteration"] == 1


def test_returned_dict_or_number_is_the_last_report(tmp_path: Any) -> None:
    grid = tuner(lambda c: {"loss": c["x"]}, tmp_path, name="dict", num_samples=1).fit()
    assert grid[0].metrics["loss"] == grid[0].config["x"]
    grid = tuner(lambda c: c["x"] * 2, tmp_path, name="number", num_samples=1).fit()
    assert grid[0].metrics["loss"] == grid[0].config["x"] * 2


def test_second_fit_resumes_without_rerunning_finished_trials(tmp_path: Any) -> None:
    calls: list[float] = []
    lock = threading.Lock()

    def trainable(config: dict[str, Any]) -> None:
        with lock:
            calls.append(config["x"])
        tune.report({"loss": config["x"]})

    first = tuner(
        trainable, tmp_path, num_samples=3, sampler=optuna.samplers.RandomSampler(seed=0)
    ).fit()
    assert len(calls) == 3
    assert tune.Tuner.can_restore(str(tmp_path), "exp")
    assert not tune.Tuner.can_restore(str(tmp_path), "other")
    again = tuner(
        trainable, tmp_path, num_samples=3, sampler=optuna.samplers.RandomSampler(seed=0)
    ).fit()
    assert len(calls) == 3  # nothing re-run
    assert [r.config for r in again] == [r.config for r in first]
    more = tuner(
        trainable, tmp_path, num_samples=5, sampler=optuna.samplers.RandomSampler(seed=0)
    ).fit()
    assert len(calls) == 5
    assert len(more) == 5


def test_define_by_run_space_end_to_end(tmp_path: Any) -> None:
    def space(trial: optuna.Trial) -> dict[str, Any]:
        kind = trial.suggest_categorical("kind", ["a", "b"])
        return {"kind": kind, "x": trial.suggest_float("x", 0, 1) if kind == "a" else 0.5}

    grid = tuner(
        lambda c: {"loss": c["x"]},
        tmp_path,
        param_space=space,
        num_samples=6,
        sampler=optuna.samplers.RandomSampler(seed=0),
    ).fit()
    assert len(grid) == 6
    assert grid.num_errors == 0
    df = grid.get_dataframe()
    assert set(df["config/kind"]) <= {"a", "b"}


def test_errors_are_kept_with_tracebacks_and_the_sweep_goes_on(tmp_path: Any) -> None:
    def trainable(config: dict[str, Any]) -> None:
        if tune.get_context().get_trial_id() == "00000":
            raise ValueError("lr too high")
        tune.report({"loss": 1.0})

    grid = tuner(trainable, tmp_path, num_samples=3).fit()
    assert grid.num_errors == 1
    assert grid.num_terminated == 2
    (err,) = grid.errors
    assert err.exc_type == "ValueError"
    assert "lr too high" in str(err)
    assert "Traceback" in err.traceback
    assert grid.get_best_result().trial_name != "trial_00000"


def test_metric_never_reported_raises_from_fit(tmp_path: Any) -> None:
    with pytest.raises(tune.MetricNotReportedError, match="'loss'"):
        tuner(lambda c: tune.report({"accuracy": 1.0}), tmp_path).fit()


def test_report_outside_a_trial_is_a_clear_error() -> None:
    with pytest.raises(tune.TuneError, match="outside a trial"):
        tune.report({"loss": 1.0})
    with pytest.raises(tune.TuneError, match="outside a trial"):
        tune.get_context()


def test_logger_callbacks_write_into_trial_directories(tmp_path: Any) -> None:
    class Recorder(tune.Callback):
        def __init__(self) -> None:
            self.events: list[str] = []

        def on_trial_start(self, trial: Trial) -> None:
            self.events.append(f"start {trial.trial_name}")

        def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
            self.events.append(f"result {trial.trial_name} {result['training_iteration']}")

        def on_trial_complete(self, trial: Trial) -> None:
            self.events.append(f"complete {trial.trial_name}")

    def trainable(config: dict[str, Any]) -> None:
        for i in range(3):
            tune.report({"loss": config["x"] + i})

    rec = Recorder()
    grid = tuner(
        trainable,
        tmp_path,
        num_samples=1,
        max_concurrent_trials=1,
        callbacks=[
            tune.CSVLoggerCallback(),
            tune.JSONLoggerCallback(),
            tune.TBXLoggerCallback(),
            rec,
        ],
    ).fit()
    path = grid[0].path
    rows = [json.loads(line) for line in open(os.path.join(path, "result.json"))]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    csv_lines = open(os.path.join(path, "progress.csv")).read().splitlines()
    assert csv_lines[0] == "loss,training_iteration"
    assert len(csv_lines) == 4
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(path))
    assert rec.events == [
        "start trial_00000",
        "result trial_00000 1",
        "result trial_00000 2",
        "result trial_00000 3",
        "complete trial_00000",
    ]


def test_console_plain_lines_when_not_a_terminal(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    tuner(lambda c: {"loss": c["x"]}, tmp_path, name="v1", verbose=1).fit()
    out = capsys.readouterr().out
    assert "[lumos.tune" in out
    assert "2 TERMINATED" in out
    assert "best trial_0000" in out
    tuner(lambda c: {"loss": c["x"]}, tmp_path, name="v0", verbose=0).fit()
    assert capsys.readouterr().out == ""


def test_console_table_and_waiting_note() -> None:
    buf = io.StringIO()
    reporter = ConsoleReporter(["loss"], verbose=2, file=buf, force_terminal=True, refresh_s=0)
    t0 = LiveTrial(number=0, config={"lr": 0.1, "m": {"w": 4}}, params={}, path="/p/0")
    t0.status, t0.last_result, t0.iteration = TrialStatus.TERMINATED, {"loss": 0.5}, 3
    t1 = LiveTrial(number=1, config={"lr": 0.2, "m": {"w": 8}}, params={}, path="/p/1")
    t1.status, t1.waiting_for_resources = TrialStatus.RUNNING, True
    reporter.update([t0, t1])
    reporter.waiting_for_resources([t1], {"CPU": 1.0})
    reporter.trial_done(t0)
    reporter.close([t0, t1])
    text = buf.getvalue()
    assert "trial_00000" in text
    assert "m/w" in text
    assert "PENDING (resources)" in text
    assert "trial_00001: waiting for resources" in text
    assert "max_concurrent_trials" in text
    assert "trial_00000 TERMINATED (loss=0.5)" in text


def test_time_budget_stops_running_trials_as_terminated(tmp_path: Any) -> None:
    def trainable(config: dict[str, Any]) -> None:
        job = job_context.current()
        assert job is not None
        for _ in range(10_000):
            tune.report({"loss": config["x"]})
            if job.stop_event.wait(0.02):
                tune.report({"loss": config["x"]})  # raises TrialPruned: the budget is spent

    grid = tuner(trainable, tmp_path, num_samples=-1, time_budget_s=1.0).fit()
    assert len(grid) >= 2
    assert all(r.status == "TERMINATED" for r in grid), [r.status for r in grid]
    assert grid.num_errors == 0
    assert all(r.metrics["training_iteration"] < 10_000 for r in grid)
