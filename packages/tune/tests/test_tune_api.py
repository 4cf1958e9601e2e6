"""Ray Tune's everyday API in lumos (no Ray): search-space sugar, get_best_result scopes,
best_checkpoints, stoppers, with_resources, Tuner.restore / can_restore / get_results."""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from typing import Any

import fsspec
import optuna
import pytest
from tune_helpers import make_controller

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage import RunStorage
from lumos.tune._internal.result import Result, ResultGrid
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.stopper import (
    CombinedStopper,
    MaximumIterationStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
)
from lumos.tune.testing import ScriptedExecutor, Step, report


def fake_pool(resources: dict[str, float]) -> FakeWorkerPool:
    return FakeWorkerPool(resources)


# -- search space ----------------------------------------------------------------------


def _samples(space: dict[str, Any], n: int) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    compiled = SearchSpace(space)
    return [compiled.sample(study.ask()) for _ in range(n)]


def test_randn_qrandn_qlograndint_and_sample_from() -> None:
    space = {
        "w": tune.randn(3.0, 0.5),
        "q": tune.qrandn(0.0, 1.0, 0.25),
        "batch": tune.qlograndint(16, 1024, 16),
        "lr": tune.loguniform(1e-4, 1e-1),
        "warm": tune.sample_from(lambda spec: spec.config.lr / 10),
        "nested": {"twice": tune.sample_from(lambda spec: spec.config["batch"] * 2)},
    }
    configs = _samples(space, 400)
    ws = [c["w"] for c in configs]
    assert statistics.mean(ws) == pytest.approx(3.0, abs=0.1)
    assert statistics.stdev(ws) == pytest.approx(0.5, abs=0.1)
    assert all(c["q"] / 0.25 == pytest.approx(round(c["q"] / 0.25)) for c in configs)
    assert all(isinstance(c["batch"], int) and c["batch"] % 16 == 0 for c in configs)
    assert all(16 <= c["batch"] <= 1024 for c in configs)
    assert all(c["warm"] == pytest.approx(c["lr"] / 10) for c in configs)
    assert all(c["nested"]["twice"] == 2 * c["batch"] for c in configs)


def test_bad_search_space_sugar_is_a_clear_error() -> None:
    with pytest.raises(tune.SearchSpaceError, match=r"randn\(sd=0"):
        tune.randn(0.0, 0)
    with pytest.raises(tune.SearchSpaceError, match=r"qlograndint\(q=0"):
        tune.qlograndint(1, 100, 0)
    with pytest.raises(tune.SearchSpaceError, match="sample_from"):
        tune.sample_from(3)  # type: ignore[arg-type]
    with pytest.raises(tune.SearchSpaceError, match=r"tune\.sample_from"):
        SearchSpace({"f": lambda spec: 1})


# -- get_best_result scopes -------------------------------------------------------------


def _result(name: str, losses: list[float], status: str = "TERMINATED") -> Result:
    history = [{"loss": v, "training_iteration": i + 1} for i, v in enumerate(losses)]
    return Result(history[-1], {}, "", history=history, trial_name=name, status=status)


def test_get_best_result_scopes() -> None:
    grid = ResultGrid(
        [
            _result("a", [5.0, 1.0, 4.0, 4.0, 4.0, 4.0]),
            _result("b", [3.0, 3.0, 3.0, 3.0, 3.0, 3.5]),
            _result("c", [9.0, 9.0, 9.0, 2.0, 2.0, 2.0, 2.0, 2.0]),
        ],
        "loss",
        "min",
    )
    assert grid.get_best_result().trial_name == "c"  # last
    assert grid.get_best_result(scope="all").trial_name == "a"  # best ever: 1.0
    assert grid.get_best_result(scope="avg").trial_name == "b"  # 3.08 < 3.67 < 4.63
    assert grid.get_best_result(scope="last-5-avg").trial_name == "c"  # 3.4 / 3.1 / 2.0
    assert grid.get_best_result(scope="last-10-avg").trial_name == "b"  # as avg
    assert grid.get_best_result("loss", "max", scope="all").trial_name == "c"  # 9.0
    with pytest.raises(tune.TuneConfigError, match=r"scope='first'.*'last-5-avg'"):
        grid.get_best_result(scope="first")


def test_get_best_result_filters_nan_and_inf_unless_told_not_to() -> None:
    grid = ResultGrid(
        [_result("a", [1.0]), _result("nan", [math.nan]), _result("inf", [-math.inf])],
        "loss",
        "min",
    )
    assert grid.get_best_result().trial_name == "a"
    assert grid.get_best_result(filter_nan_and_inf=False).trial_name == "inf"


# -- stoppers --------------------------------------------------------------------------


def test_stoppers_semantics() -> None:
    it = MaximumIterationStopper(3)
    assert [it("t", {"training_iteration": i}) for i in (1, 2, 3)] == [False, False, True]
    plateau = TrialPlateauStopper("loss", std=0.01, num_results=3, grace_period=3)
    assert [plateau("t", {"loss": v}) for v in (5.0, 1.0, 1.0, 1.0)] == [
        False,
        False,
        False,
        True,
    ]
    capped = TrialPlateauStopper(
        "loss", num_results=2, grace_period=2, metric_threshold=0.5, mode="min"
    )
    assert [capped("t", {"loss": 1.0}) for _ in range(4)] == [False] * 4  # never below 0.5
    assert TimeoutStopper(1e-9).stop_all()
    assert not TimeoutStopper(3600).stop_all()
    both = CombinedStopper(MaximumIterationStopper(2), TimeoutStopper(3600))
    assert both("t", {"training_iteration": 2})
    assert not both.stop_all()
    with pytest.raises(tune.TuneConfigError, match="max_iter"):
        MaximumIterationStopper(0)
    with pytest.raises(tune.TuneConfigError, match="mode"):
        TrialPlateauStopper("loss", metric_threshold=1.0)


def _steps(spec: TrialSpec) -> list[Step]:
    return [report({"loss": 1.0 / (i + 1)}, checkpoint=True) for i in range(6)]


def test_a_stopper_object_stops_trials_and_stop_all_ends_the_sweep(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=3, stop=MaximumIterationStopper(2))
    ctl, _ = make_controller(str(tmp_path / "a"), _steps, cfg, {"x": tune.uniform(0, 1)})
    trials = ctl.run()
    assert [t.iteration for t in trials] == [2, 2, 2]
    assert all(t.status is TrialStatus.TERMINATED for t in trials)

    class AfterFour(Stopper):
        def __init__(self) -> None:
            self.seen = 0

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            self.seen += 1
            return False

        def stop_all(self) -> bool:
            return self.seen >= 4

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=10, stop=AfterFour())
    ctl, ex = make_controller(
        str(tmp_path / "b"), _steps, cfg, {"x": tune.uniform(0, 1)}, max_concurrent=2
    )
    trials = ctl.run()
    assert len(ex.started) == 2  # no trial started after stop_all()
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    assert all(t.iteration < 6 for t in trials)


# -- Result.best_checkpoints -------------------------------------------------------------


def test_best_checkpoints_lists_the_kept_checkpoints_with_their_metrics(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1)
    ex = ScriptedExecutor(_steps, storage=RunStorage(str(tmp_path), "exp"))
    ctl, _ = make_controller(str(tmp_path), _steps, cfg, {"x": tune.uniform(0, 1)}, executor=ex)
    (trial,) = ctl.run()
    result = Result.from_trial(trial.snapshot(), fsspec.filesystem("file"))
    best = result.best_checkpoints
    assert [m["training_iteration"] for _, m in best] == [1, 2, 3, 4, 5, 6]
    assert best[-1][1]["loss"] == pytest.approx(1 / 6)
    with best[-1][0].as_directory() as d:
        assert os.path.exists(os.path.join(d, "state.json"))


# -- with_resources --------------------------------------------------------------------------


def test_with_resources_sets_the_trial_resources() -> None:
    def objective(config: dict[str, Any]) -> None:
        return None

    tuner = tune.Tuner(tune.with_resources(objective, {"CPU": 2, "GPU": 0}))
    assert tuner.tune_config.trial_resources == {"CPU": 2.0, "GPU": 0.0}
    assert tune.Tuner(tune.with_resources(objective, 3)).tune_config.trial_resources == {"CPU": 3.0}
    assert tuner.experiment_name.startswith("objective-")
    with pytest.raises(tune.TuneConfigError, match="disagree"):
        tune.Tuner(
            tune.with_resources(objective, {"CPU": 2}),
            tune_config=tune.TuneConfig(trial_resources={"CPU": 1}),
        )
    with pytest.raises(ValueError, match="CPU"):
        tune.with_resources(objective, {"CPU": -1})


def _shaped(config: dict[str, Any]) -> None:
    tune.report({"loss": config["cpus"], "got": tune.get_context().get_trial_resources()["CPU"]})


def test_with_resources_of_config_gives_each_trial_its_own_shape(tmp_path: Any) -> None:
    pools: list[FakeWorkerPool] = []

    def factory(resources: dict[str, float]) -> FakeWorkerPool:
        pools.append(FakeWorkerPool(resources))
        return pools[-1]

    grid = tune.Tuner(
        tune.with_resources(_shaped, lambda config: {"cpu": config["cpus"]}),
        param_space={"cpus": tune.grid_search([1, 1, 2, 2, 1])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(name="shapes", storage_path=str(tmp_path), verbose=0),
        _pool_factory=factory,
    ).fit()
    assert grid.num_terminated == 5
    for result in grid:
        assert result.metrics["got"] == result.config["cpus"]
    (pool,) = pools
    # one worker per change of shape: equal shapes reuse the idle worker (1, 1 | 2, 2 | 1)
    assert [r["CPU"] for r in pool.worker_resources.values()] == [1.0, 2.0, 1.0]
    assert len(pool.removed) >= 2  # an idle worker of the other shape made room


def test_with_resources_of_config_rejects_a_bad_shape(tmp_path: Any) -> None:
    with pytest.raises(tune.TuneConfigError, match="with_resources"):
        tune.Tuner(
            tune.with_resources(_shaped, lambda config: "lots"),
            param_space={"cpus": 1},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(name="bad", storage_path=str(tmp_path), verbose=0),
            _pool_factory=fake_pool,
        ).fit()


# -- Tuner.restore / can_restore / get_results ----------------------------------------------


def counted(config: dict[str, Any]) -> None:
    marks = config["marks"]
    open(os.path.join(marks, f"{tune.get_context().get_trial_name()}.run"), "a").close()
    tune.report({"loss": config["x"]})


def test_restore_reuses_the_stored_space_and_config(tmp_path: Any) -> None:
    marks = tempfile.mkdtemp(dir=tmp_path)
    path = str(tmp_path / "sweep")
    assert not tune.Tuner.can_restore(path)
    tuner = tune.Tuner(
        counted,
        param_space={"x": tune.uniform(0, 1), "marks": marks},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=3),
        run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path), verbose=0),
        _pool_factory=fake_pool,
    )
    first = tuner.fit()
    assert tuner.get_results() is first
    assert tune.Tuner.can_restore(path)
    assert tune.Tuner.can_restore(str(tmp_path), "sweep")

    restored = tune.Tuner.restore(path, counted)
    assert restored.tune_config.num_samples == 3
    assert restored.tune_config.metric == "loss"
    stored = restored.get_results()  # before fit: read from storage
    assert [r.config["x"] for r in stored] == [r.config["x"] for r in first]
    assert stored.get_best_result().trial_name == first.get_best_result().trial_name
    restored._pool_factory = fake_pool
    again = restored.fit()
    assert len(again) == 3
    assert sorted(os.listdir(marks)) == [f"trial_{i:05d}.run" for i in range(3)]  # none rerun
    with pytest.raises(tune.TuneError, match="no experiment"):
        tune.Tuner.restore(str(tmp_path / "nope"), counted)
    with pytest.raises(tune.TuneConfigError, match="restart_errored"):
        tune.Tuner.restore(path, counted, restart_errored=True)


# -- trial_name_creator / trial_dirname_creator ---------------------------------------------


def named(config: dict[str, Any]) -> None:
    ctx = tune.get_context()
    tune.report({"loss": config["x"], "name": ctx.get_trial_name(), "dir": ctx.get_trial_dir()})


def test_name_creators_name_trials_and_their_directories(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=3,
        trial_name_creator=lambda t: f"x={t.config['x']:.3f}",
        trial_dirname_creator=lambda t: "same",  # clashes get the trial id
    )
    tuner = tune.Tuner(
        named,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=cfg,
        run_config=tune.RunConfig(name="names", storage_path=str(tmp_path), verbose=0),
        _pool_factory=fake_pool,
    )
    grid = tuner.fit()
    dirs = [os.path.basename(r.path) for r in grid]
    assert dirs == ["same", "same_00001", "same_00002"]
    for r in grid:
        assert r.trial_name == f"x={r.config['x']:.3f}" == r.metrics["name"]
        assert r.metrics["dir"].endswith("/" + os.path.basename(r.path))
    # a restore finds them again
    again = tune.Tuner.restore(str(tmp_path / "names"), named).get_results()
    assert [r.trial_name for r in again] == [r.trial_name for r in grid]
    assert [r.path for r in again] == [r.path for r in grid]
    bad = tune.TuneConfig(metric="loss", mode="min", trial_dirname_creator=lambda t: "a/b")
    with pytest.raises(ValueError, match="trial_dirname_creator"):
        tune.Tuner(
            named,
            param_space={"x": tune.uniform(0, 1)},
            tune_config=bad,
            run_config=tune.RunConfig(name="bad", storage_path=str(tmp_path), verbose=0),
            _pool_factory=fake_pool,
        ).fit()
