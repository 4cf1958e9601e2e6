"""Integration tests on one real local Ray cluster (session fixture, 4 CPUs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import optuna
import pytest
from ray import cloudpickle

from lumos import tune

# The trial functions below live in this test module, which Ray's workers cannot import:
# ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run_config(tmp_path: Any, name: str, **kw: Any) -> tune.RunConfig:
    return tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=kw.pop("verbose", 0), **kw)


def quadratic(config: dict[str, Any]) -> None:
    tune.report({"loss": (config["x"] - 2.0) ** 2, "pid": os.getpid()})


def test_seeded_tpe_gives_the_same_first_configs_and_reuses_actors(
    ray_cluster: Any, tmp_path: Any
) -> None:
    def fit(name: str) -> tune.ResultGrid:
        return tune.Tuner(
            quadratic,
            param_space={"x": tune.uniform(-10, 10), "n": tune.randint(1, 100)},
            tune_config=tune.TuneConfig(
                metric="loss",
                mode="min",
                num_samples=8,
                max_concurrent_trials=2,
                sampler=optuna.samplers.TPESampler(seed=0),
            ),
            run_config=run_config(tmp_path, name),
        ).fit()

    a, b = fit("tpe-a"), fit("tpe-b")
    assert [r.config for r in a] == [r.config for r in b]
    assert a.num_terminated == 8
    assert len({r.metrics["pid"] for r in a}) <= 2  # 8 trials on 2 reused actors


def learning_curve(config: dict[str, Any]) -> None:
    from lumos.runtime import context

    x = config["x"]
    job = context.current()
    assert job is not None
    for step in range(8):
        tune.report({"loss": (x - 2.0) ** 2 + 1.0 / (step + 1)})
        # one "epoch" of work; a pruned trial stops waiting at once
        job.stop_event.wait(0.06)


def test_successive_halving_stops_bad_trials_early(ray_cluster: Any, tmp_path: Any) -> None:
    def fit(name: str, pruner: optuna.pruners.BasePruner | None) -> tune.ResultGrid:
        return tune.Tuner(
            learning_curve,
            param_space={"x": tune.uniform(-5, 5)},
            tune_config=tune.TuneConfig(
                metric="loss",
                mode="min",
                num_samples=12,
                max_concurrent_trials=1,
                pruner=pruner,
                sampler=optuna.samplers.RandomSampler(seed=7),
            ),
            run_config=run_config(tmp_path, name),
        ).fit()

    full = fit("sh-none", None)
    sh = fit("sh", optuna.pruners.SuccessiveHalvingPruner())
    iters = lambda g: sum(r.metrics["training_iteration"] for r in g)  # noqa: E731
    assert iters(sh) < iters(full)
    assert any(r.status == "PRUNED" for r in sh)
    assert sh.get_best_result().config == full.get_best_result().config
    assert sh.get_best_result().metrics["loss"] == pytest.approx(
        full.get_best_result().metrics["loss"]
    )


def flaky_with_checkpoints(config: dict[str, Any]) -> None:
    import tempfile

    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    for step in range(start, 5):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            tune.report(
                {"loss": 1.0 / (step + 1), "start": start},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
        if step == 2 and tune.get_context().get_attempt() == 0:
            raise RuntimeError("simulated crash in the trial")


def test_a_trial_that_raises_is_retried_from_its_checkpoint(
    ray_cluster: Any, tmp_path: Any
) -> None:
    grid = tune.Tuner(
        flaky_with_checkpoints,
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=1),
        run_config=run_config(
            tmp_path,
            "retry",
            failure_config=tune.FailureConfig(max_failures=1),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        ),
    ).fit()
    (result,) = list(grid)
    assert result.status == "TERMINATED"
    assert result.metrics["start"] == 3  # resumed after the checkpoint of step 2
    assert [e.exc_type for e in result.errors] == ["RuntimeError"]
    assert "simulated crash in the trial" in result.errors[0].traceback
    assert list(result.metrics_dataframe["training_iteration"]) == [1, 2, 3, 4, 5]
    kept = sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_"))
    assert kept == ["checkpoint_000004", "checkpoint_000005"]


def two_objectives(config: dict[str, Any]) -> None:
    x = config["x"]
    tune.report({"loss": x**2, "cost": (x - 2) ** 2})


def test_multi_objective_returns_a_pareto_front(ray_cluster: Any, tmp_path: Any) -> None:
    grid = tune.Tuner(
        two_objectives,
        param_space={"x": tune.uniform(-1, 3)},
        tune_config=tune.TuneConfig(
            metric=["loss", "cost"],
            mode=["min", "min"],
            num_samples=12,
            max_concurrent_trials=2,
            sampler=optuna.samplers.NSGAIISampler(seed=0),
        ),
        run_config=run_config(tmp_path, "moo"),
    ).fit()
    front = grid.get_pareto_front()
    study = tune.load_study(str(tmp_path), "moo")
    assert sorted(r.trial_name for r in front) == sorted(
        f"trial_{t.number:05d}" for t in study.best_trials
    )
    # on this problem the front is exactly the trials with x in [0, 2]
    assert {r.trial_name for r in front} == {r.trial_name for r in grid if 0 <= r.config["x"] <= 2}


def test_metric_never_reported_and_bad_mode_are_clear_errors(
    ray_cluster: Any, tmp_path: Any
) -> None:
    with pytest.raises(tune.MetricNotReportedError, match="TuneConfig\\(metric='loss'\\)"):
        tune.Tuner(
            lambda c: tune.report({"acc": 1.0}),
            tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=2),
            run_config=run_config(tmp_path, "nometric"),
        ).fit()
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        tune.TuneConfig(metric="loss", mode="minimum")
    with pytest.raises(ValueError, match="low must be <= high"):
        tune.uniform(1, 0)


def resources_of_trial(config: dict[str, Any]) -> None:
    tune.report({"loss": 0.0, "cpus": tune.get_context().get_trial_resources()["CPU"]})


def test_a_trial_may_reserve_no_cpu(ray_cluster: Any, tmp_path: Any) -> None:
    grid = tune.Tuner(
        resources_of_trial,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=2, max_concurrent_trials=2, trial_resources=0
        ),
        run_config=run_config(tmp_path, "zero-cpu"),
    ).fit()
    assert grid.num_terminated == 2, [r.error for r in grid]
    assert [r.metrics["cpus"] for r in grid] == [0.0, 0.0]


def held_trial(config: dict[str, Any]) -> None:
    # Holds its actor's CPUs until the driver has said the other trial waits for them.
    deadline = time.monotonic() + 120
    while not os.path.exists(config["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)  # another process's file: nothing to wait on
    tune.report({"loss": config["x"]})


def test_trials_wait_for_resources_and_the_console_says_why(
    ray_cluster: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    from lumos.tune._internal.progress import ConsoleReporter

    release = tmp_path / "release"
    announce = ConsoleReporter.waiting_for_resources

    def announce_then_release(self: Any, trials: Any, resources: dict[str, float]) -> None:
        announce(self, trials, resources)
        release.touch()

    monkeypatch.setattr(ConsoleReporter, "waiting_for_resources", announce_then_release)
    grid = tune.Tuner(
        held_trial,
        param_space={"x": tune.uniform(0, 1), "release": str(release)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=2,
            max_concurrent_trials=2,
            trial_resources={"CPU": 3},
        ),
        run_config=run_config(tmp_path, "resources", verbose=1),
    ).fit()
    assert grid.num_terminated == 2
    out = capsys.readouterr().out
    assert "waiting for resources" in out
    assert "needs CPU=3 and" in out


DRIVER = textwrap.dedent(
    """
    import os, sys, time, uuid
    import optuna, ray
    from lumos import tune

    address, storage, marks = sys.argv[1:4]
    gate = os.path.join(marks, "..", "go")
    ray.init(address=address, log_to_driver=False)

    def trainable(config):
        name = tune.get_context().get_trial_name()
        open(os.path.join(marks, f"{name}.{uuid.uuid4().hex}"), "w").close()
        start = 0
        if (ckpt := tune.get_checkpoint()) is not None:
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "step")).read()) + 1
        number = int(name.split("_")[1])
        for step in range(start, 4):
            # Trials 3+ hold after their first report until the test has killed this
            # driver (it then creates the gate file), so the kill lands mid-sweep.
            while number >= 3 and step >= 1 and not os.path.exists(gate):
                time.sleep(0.05)  # another process's file: nothing to wait on
            d = os.path.join(marks, "..", "ckpt-src", f"{name}-{step}-{uuid.uuid4().hex}")
            os.makedirs(d)
            open(os.path.join(d, "step"), "w").write(str(step))
            tune.report({"loss": config["x"] + 1.0 / (step + 1)},
                        checkpoint=tune.Checkpoint.from_directory(d))

    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=10,
                                    max_concurrent_trials=2,
                                    sampler=optuna.samplers.TPESampler(seed=0)),
        run_config=tune.RunConfig(name="killme", storage_path=storage, verbose=0),
    ).fit()
    print("DONE", len(grid), grid.num_terminated, flush=True)
    """
)


def _ended_trials(journal: str) -> set[int]:
    import fsspec

    from lumos.tune._internal.journal import FsJournal
    from lumos.tune._internal.trial_journal import EndRecord, TrialJournal

    reader = TrialJournal(FsJournal(fsspec.filesystem("file"), journal, writable=False))
    return {r.number for r in reader.read() if isinstance(r, EndRecord)}


def test_sigkill_of_the_driver_then_rerun_resumes_without_repeating_finished_trials(
    ray_cluster: Any, tmp_path: Any
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "ckpt-src").mkdir()
    storage = tmp_path / "results"
    address = ray_cluster.address_info["address"]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, str(script), address, str(storage), str(marks)]
    journal = storage / "killme" / "_lumos" / "trials.journal"

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    try:
        while len(_ended_trials(str(journal))) < 3:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "the sweep made no progress"
            time.sleep(0.1)  # watching another process's file: nothing to wait on
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    (tmp_path / "go").touch()  # held trials may go on in the rerun
    finished_before = _ended_trials(str(journal))
    assert 3 <= len(finished_before) < 10

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "DONE 10 10" in rerun.stdout

    runs: dict[str, int] = {}
    for mark in os.listdir(marks):
        trial = mark.split(".")[0]
        runs[trial] = runs.get(trial, 0) + 1
    for number in finished_before:
        assert runs[f"trial_{number:05d}"] == 1, f"finished trial {number} ran again"
    assert len(runs) == 10
    study = tune.load_study(str(storage), "killme")
    assert len(study.trials) == 10
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
