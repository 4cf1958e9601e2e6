"""Two sweeps never share one stored experiment: unique default names, and
``RunConfig(if_exists="resume" | "error" | "new")`` (in-process: FakeWorkerPool, no Ray).

A rerun resumes only the same sweep (trainable, metric, mode, search space, sampler);
another one is kept untouched and the new sweep runs beside it (``name-2``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from lumos import tune
from lumos.runtime._internal import run_claim
from lumos.runtime.testing import FakeWorkerPool

CALLS: list[str] = []
_LOCK = threading.Lock()


def objective(config: dict[str, Any]) -> None:
    with _LOCK:
        CALLS.append("objective")
    tune.report({"loss": config["x"], "acc": 1 - config["x"]})


def another_objective(config: dict[str, Any]) -> None:
    with _LOCK:
        CALLS.append("another_objective")
    tune.report({"loss": config["x"], "acc": 1 - config["x"]})


def sweep(tmp_path: Path, trainable: Any = objective, **kw: Any) -> tune.Tuner:
    run_kw = {k: kw.pop(k) for k in ("name", "if_exists", "verbose") if k in kw}
    run_kw.setdefault("name", "exp")
    run_kw.setdefault("verbose", 0)
    if run_kw["name"] is None:
        del run_kw["name"]
    space = kw.pop("param_space", {"x": tune.uniform(0, 1)})
    tc = {"metric": "loss", "mode": "min", "num_samples": 2, "max_concurrent_trials": 2, **kw}
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(**tc),
        run_config=tune.RunConfig(storage_path=str(tmp_path), **run_kw),
        _pool_factory=FakeWorkerPool,
    )


def stored_trials(path: Path) -> int:
    return len(tune.Tuner.restore(str(path), objective).get_results())


@pytest.fixture(autouse=True)
def _calls() -> None:
    CALLS.clear()


# -- unique default names ---------------------------------------------------------------


def test_two_default_named_sweeps_in_the_same_second_are_two_experiments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = time.gmtime()
    monkeypatch.setattr(run_claim.time, "gmtime", lambda *a: second)  # one second for both
    first, other = sweep(tmp_path, name=None), sweep(tmp_path, name=None)
    assert first.experiment_name != other.experiment_name
    assert first.experiment_name.startswith(
        "objective-" + time.strftime("%Y-%m-%d_%H-%M-%S", second)
    )
    first.fit()
    other.fit()
    assert len(CALLS) == 4  # the second ran its own trials, it did not reopen the first
    for tuner in (first, other):
        assert stored_trials(tmp_path / tuner.experiment_name) == 2
    # a second fit() of one Tuner resumes its own (finished) experiment
    assert len(first.fit()) == 2
    assert len(CALLS) == 4


def test_a_clashing_generated_name_is_detected_and_another_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_claim.secrets.token_hex
    draws = iter(["abc123", "abc123"])  # the same random suffix twice: a clash
    monkeypatch.setattr(run_claim.secrets, "token_hex", lambda n: next(draws, None) or real(n))
    first, other = sweep(tmp_path, name=None), sweep(tmp_path, name=None)
    assert first.experiment_name == other.experiment_name
    first.fit()
    grid = other.fit()
    assert other.experiment_name != first.experiment_name
    assert grid.experiment_path == str(tmp_path / other.experiment_name)
    assert len(CALLS) == 4
    assert stored_trials(tmp_path / first.experiment_name) == 2


SCRIPT = textwrap.dedent(
    """
    import json, secrets, sys, time
    from lumos import tune
    from lumos.runtime.testing import FakeWorkerPool

    real, first = secrets.token_hex, [True]
    def token_hex(n):  # both processes draw the same first name: a clash to detect
        if first[0]:
            first[0] = False
            return "c0ffee"
        return real(n)
    secrets.token_hex = token_hex
    fixed = time.gmtime(1_700_000_000)
    time.gmtime = lambda *a: fixed

    def objective(config):
        time.sleep(0.5)
        tune.report({"loss": config["x"]})

    tuner = tune.Tuner(
        objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=2),
        run_config=tune.RunConfig(storage_path=sys.argv[1], verbose=0),
        _pool_factory=FakeWorkerPool,
    )
    grid = tuner.fit()
    print(json.dumps({"name": tuner.experiment_name, "trials": len(grid)}))
    """
)


def test_two_processes_started_together_get_two_experiments(tmp_path: Path) -> None:
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    storage = tmp_path / "results"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(storage)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    names = {o["name"] for o in outs}
    assert len(names) == 2, outs
    assert "objective-2023-11-14_22-13-20-c0ffee" in names  # one of them got the first name
    assert all(o["trials"] == 2 for o in outs)
    for name in names:
        assert stored_trials(storage / name) == 2


# -- if_exists ---------------------------------------------------------------------------


def test_resume_returns_a_finished_sweep_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = sweep(tmp_path, sampler=optuna.samplers.RandomSampler(seed=0)).fit()
    capsys.readouterr()
    again = sweep(tmp_path, sampler=optuna.samplers.RandomSampler(seed=1), verbose=1).fit()
    assert len(CALLS) == 2  # nothing ran again
    assert [r.config for r in again] == [r.config for r in first]
    out = capsys.readouterr().out
    uri = str(tmp_path / "exp")
    assert f"experiment 'exp' in {uri} already finished at " in out
    assert "; returning its stored result (RunConfig(if_exists='new') runs it again)" in out
    assert "TERMINATED" not in out  # no sweep ran: no progress table


def test_error_refuses_a_stored_experiment(tmp_path: Path) -> None:
    sweep(tmp_path).fit()
    with pytest.raises(tune.TuneConfigError) as info:
        sweep(tmp_path, if_exists="error").fit()
    text = str(info.value)
    for part in ("if_exists='error'", "experiment named 'exp'", str(tmp_path / "exp"), "'new'"):
        assert part in text
    assert len(CALLS) == 2
    assert sweep(tmp_path, name="fresh", if_exists="error").fit().num_errors == 0


def test_new_always_starts_beside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep(tmp_path).fit()
    tuner = sweep(tmp_path, if_exists="new", verbose=1)
    grid = tuner.fit()
    assert tuner.experiment_name == "exp-2"
    assert grid.experiment_path == str(tmp_path / "exp-2")
    assert (
        f"[lumos.tune] experiment 'exp' already exists at {tmp_path / 'exp'}: starting a new "
        "experiment 'exp-2' beside it (RunConfig(if_exists='new'))"
    ) in capsys.readouterr().out
    third = sweep(tmp_path, if_exists="new")
    third.fit()
    assert third.experiment_name == "exp-3"
    assert len(CALLS) == 6
    assert stored_trials(tmp_path / "exp") == 2


BASE: dict[str, Any] = {}
CHANGES = {
    "metric": ({"metric": "acc"}, "metric 'loss' there, 'acc' here"),
    "mode": ({"mode": "max"}, "mode 'min' there, 'max' here"),
    "space": (
        {"param_space": {"x": tune.uniform(0, 2)}},
        "search space: 'x' uniform(0.0, 1.0) there, uniform(0.0, 2.0) here",
    ),
    "trainable": (
        {"trainable": another_objective},
        "trainable 'objective' there, 'another_objective' here",
    ),
    "sampler": (
        {"sampler": optuna.samplers.RandomSampler(seed=0)},
        "sampler 'TPESampler' there, 'RandomSampler' here",
    ),
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_another_sweep_under_the_same_name_runs_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    sweep(tmp_path).fit()
    stored_definition = (tmp_path / "exp" / "_lumos" / "tuner.json").read_text()
    change, why = CHANGES[field]
    kw = dict(change)
    trainable = kw.pop("trainable", objective)
    tuner = sweep(tmp_path, trainable, verbose=1, **kw)
    grid = tuner.fit()
    assert tuner.experiment_name == "exp-2"
    assert len(grid) == 2
    assert grid.num_errors == 0
    out = capsys.readouterr().out
    assert (
        f"[lumos.tune] experiment 'exp' at {tmp_path / 'exp'} is another sweep ({why}); it is "
        "kept as it is: starting this one as 'exp-2' beside it"
    ) in out
    # the stored one is untouched
    assert stored_trials(tmp_path / "exp") == 2
    assert (tmp_path / "exp" / "_lumos" / "tuner.json").read_text() == stored_definition
    # running the changed sweep again resumes its own experiment, not a third one
    rerun = sweep(tmp_path, trainable, verbose=1, **kw)
    rerun.fit()
    assert rerun.experiment_name == "exp-2"
    assert "resuming the matching experiment 'exp-2' beside it" in capsys.readouterr().out
    assert len(CALLS) == 4
    assert not (tmp_path / "exp-3").exists()


def test_constants_and_search_settings_may_change_on_resume(tmp_path: Path) -> None:
    sweep(tmp_path, param_space={"x": tune.uniform(0, 1), "data": "/a"}).fit()
    grid = sweep(tmp_path, param_space={"x": tune.uniform(0, 1), "data": "/b"}, num_samples=3).fit()
    assert len(grid) == 3  # the same sweep, extended
    assert len(CALLS) == 3
    assert not (tmp_path / "exp-2").exists()


def test_experiments_stored_before_tuner_json_are_still_read(tmp_path: Path) -> None:
    sweep(tmp_path).fit()
    (tmp_path / "exp" / "_lumos" / "tuner.json").unlink()  # as an earlier version wrote it
    other = sweep(tmp_path, another_objective)
    other.fit()  # only the metric and mode are known: the same, so it resumes
    assert other.experiment_name == "exp"
    assert len(CALLS) == 2
    assert not (tmp_path / "exp" / "_lumos" / "tuner.json").exists()  # returned as stored
    by_metric = sweep(tmp_path, metric="acc")
    by_metric.fit()  # the state's stored metric differs: beside it, not a TuneConfigError
    assert by_metric.experiment_name == "exp-2"
    sweep(tmp_path, num_samples=3).fit()  # resumed and run on: now it is recorded
    assert json.loads((tmp_path / "exp" / "_lumos" / "tuner.json").read_text())["metric"] == "loss"


def test_restore_opens_the_experiment_at_its_path_whatever_it_holds(tmp_path: Path) -> None:
    sweep(tmp_path, num_samples=3).fit()
    restored = tune.Tuner.restore(str(tmp_path / "exp"), another_objective)
    restored._pool_factory = FakeWorkerPool
    grid = restored.fit()
    assert restored.experiment_name == "exp"
    assert len(grid) == 3
    assert CALLS == ["objective"] * 3


def test_bad_if_exists_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"if_exists='overwrite' is not allowed; use 'resume'"):
        tune.RunConfig(if_exists="overwrite")
    with pytest.raises(tune.TuneConfigError, match=r"it belongs in RunConfig\(if_exists=...\)"):
        tune.TuneConfig(if_exists="new")
    assert tune.RunConfig().if_exists == "resume"
    assert os.sep not in run_claim.unique_run_name("objective")
