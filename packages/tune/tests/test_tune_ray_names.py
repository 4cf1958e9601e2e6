"""Ray Tune's names on lumos.tune: ``tune.Stopper`` and every Ray stopper, the keys of
``ray.tune.result`` (``SHOULD_CHECKPOINT`` honoured), ``utils.mock_trainable``,
``integration.ray_train.TuneReportCallback``, ``Result.filesystem``, and
``with_resources`` / ``with_parameters`` returning what Ray's return.

In-process (``FakeWorkerPool``) except where a test asks for ``ray_cluster``."""

from __future__ import annotations

import ast
import inspect
import math
import re
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
import ray
from ray import cloudpickle

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.tune.integration.ray_train import TuneReportCallback
from lumos.tune.result import DONE, SHOULD_CHECKPOINT, TRAINING_ITERATION
from lumos.tune.stopper import ExperimentPlateauStopper
from lumos.tune.utils.mock_trainable import MOCK_ERROR_KEY, MyTrainableClass

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray tests ship these functions

RAY = Path(ray.__file__).parent


def rewrite(source: str) -> str:
    """Only the imports change: ``ray.tune`` -> ``lumos.tune`` (as test_tune_ray_examples)."""
    source = re.sub(r"^from ray import tune$", "from lumos import tune", source, flags=re.M)
    return re.sub(r"^from ray\.tune", "from lumos.tune", source, flags=re.M)


def fake_pool(resources: dict[str, float]) -> FakeWorkerPool:
    return FakeWorkerPool(resources)


def _fit(tmp_path: Any, trainable: Any, name: str, **tune_config: Any) -> tune.ResultGrid:
    failure = tune_config.pop("failure", tune.FailureConfig())
    checkpoint = tune_config.pop("checkpoint", tune.CheckpointConfig())
    space = tune_config.pop("param_space", {})
    return tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(**tune_config),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            verbose=0,
            failure_config=failure,
            checkpoint_config=checkpoint,
        ),
        _pool_factory=fake_pool,
    ).fit()


def _ray_constants(*paths: Path) -> dict[str, Any]:
    """Module-level ``NAME = "value"`` constants of Ray's files (parsed: importing
    ray.tune needs pyarrow)."""
    out: dict[str, Any] = {}
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = node.value.value
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                out["__all__"] = ast.literal_eval(node.value)
    return out


# -- every public name of Ray Tune: in lumos, or in the README's "no equivalent" list ------

# Ray module (under ray/tune) -> (lumos module, Ray names with no lumos equivalent)
NO_EQUIVALENT: dict[str, tuple[str, set[str]]] = {
    "__init__.py": (
        "lumos.tune",
        {
            "register_env", "register_trainable", "run", "run_experiments", "Experiment",
            "ExperimentAnalysis", "CLIReporter", "JupyterNotebookReporter",
            "ProgressReporter", "PlacementGroupFactory", "ResumeConfig", "SyncConfig",
        },
    ),
    "schedulers/__init__.py": (
        "lumos.tune.schedulers",
        {"TrialScheduler", "PopulationBasedTrainingReplay", "HyperBandForBOHB",
         "ResourceChangingScheduler"},
    ),
    "search/__init__.py": (
        "lumos.tune.search",
        {"SearchAlgorithm", "Searcher", "Repeater", "BasicVariantGenerator",
         "SearchGenerator", "UNRESOLVED_SEARCH_SPACE", "UNDEFINED_SEARCH_SPACE",
         "UNDEFINED_METRIC_MODE"},
    ),
    "search/optuna/__init__.py": ("lumos.tune.search.optuna", set()),
    "stopper/__init__.py": ("lumos.tune.stopper", set()),
    "logger/__init__.py": ("lumos.tune.logger", {"pretty_print"}),
}  # fmt: skip


@pytest.mark.parametrize("ray_module", sorted(NO_EQUIVALENT))
def test_every_public_ray_tune_name_is_in_lumos_or_listed_as_absent(ray_module: str) -> None:
    import importlib

    lumos_module, absent = NO_EQUIVALENT[ray_module]
    ray_names = set(_ray_constants(RAY / "tune" / ray_module)["__all__"])
    assert absent <= ray_names  # the list names Ray's names, nothing else
    module = importlib.import_module(lumos_module)
    missing = sorted(n for n in ray_names - absent if not hasattr(module, n))
    assert missing == []
    assert sorted(n for n in absent if hasattr(module, n)) == []  # listed but there


# -- stoppers ------------------------------------------------------------------------------


def test_stopper_is_at_the_top_level_and_every_ray_stopper_exists() -> None:
    assert tune.Stopper is tune.stopper.Stopper
    ray_stoppers = _ray_constants(RAY / "tune" / "stopper" / "__init__.py")["__all__"]
    for name in ray_stoppers:
        cls = getattr(tune.stopper, name)
        assert issubclass(cls, tune.Stopper), name


def test_experiment_plateau_stopper_follows_rays_rule() -> None:
    stopper = ExperimentPlateauStopper("loss", std=0.01, top=3, mode="min", patience=1)
    calls = [stopper("t", {"loss": v}) for v in (5.0, 1.0, 1.0, 1.0, 1.001)]
    # the 3 best are within std after the 4th report; patience 1: stop from the 4th on
    assert calls == [False, False, False, True, True]
    assert stopper.stop_all()
    assert stopper.has_plateaued()
    assert stopper("t", {"other": 1.0}) is True  # a report without the metric is skipped
    for bad in ({"mode": "low"}, {"top": 1}, {"patience": -1}, {"std": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ExperimentPlateauStopper("loss", **bad)  # type: ignore[arg-type]


def _flat(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0})


def test_experiment_plateau_stopper_ends_a_sweep(tmp_path: Any) -> None:
    grid = _fit(
        tmp_path,
        _flat,
        "plateau",
        metric="loss",
        mode="min",
        num_samples=10,
        max_concurrent_trials=1,
        stop=ExperimentPlateauStopper("loss", top=3),
    )
    assert len(grid) < 10  # no trial starts once the best values plateaued


# -- ray.tune.result -----------------------------------------------------------------------


def test_result_keys_have_rays_values() -> None:
    ray_keys = _ray_constants(RAY / "tune" / "result.py", RAY / "air" / "constants.py")
    for name in tune.result.__all__:
        assert getattr(tune.result, name) == ray_keys[name], name


class _Saver(tune.Trainable):
    checkpoint_frequency = 0  # by default: only at the end

    def setup(self, config: dict[str, Any]) -> None:
        self.x = 0

    def step(self) -> dict[str, Any]:
        self.x += 1
        return {"x": self.x, SHOULD_CHECKPOINT: self.x == 2, DONE: self.x >= 4}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"x": self.x}


def test_should_checkpoint_in_a_step_result_saves_that_step(tmp_path: Any) -> None:
    never = tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False)
    (result,) = _fit(tmp_path, _Saver, "asked", checkpoint=never)
    assert result.metrics[TRAINING_ITERATION] == 4  # DONE ended it
    assert [m["x"] for _, m in result.best_checkpoints] == [2]
    assert result.checkpoint is not None
    (at_end,) = _fit(tmp_path, _Saver, "asked-and-end")  # default: also at the end
    assert [m["x"] for _, m in at_end.best_checkpoints] == [2, 4]


# -- utils.mock_trainable ------------------------------------------------------------------


def test_my_trainable_class_runs_in_a_tuner_and_recovers_from_its_mock_error(
    tmp_path: Any,
) -> None:
    grid = _fit(
        tmp_path,
        MyTrainableClass,
        "mock",
        param_space={"width": tune.grid_search([10, 40]), "height": 50, MOCK_ERROR_KEY: True},
        metric="episode_reward_mean",
        mode="max",
        stop={"training_iteration": 3},
        failure=tune.FailureConfig(max_failures=1),
    )
    assert grid.num_errors == 0
    for result in grid:
        assert result.status == "TERMINATED"
        assert len(result.errors) == 1  # failed once on purpose, then restored
        assert result.metrics["episode_reward_mean"] == pytest.approx(
            50 * math.tanh(3 / result.config["width"])
        )
        assert result.checkpoint is not None
    assert grid.get_best_result().config["width"] == 10


def test_rays_hyperband_example_needs_only_its_imports_changed() -> None:
    # test_tune_ray_examples.py runs the rewritten script under lumos.
    source = (RAY / "tune" / "examples" / "hyperband_example.py").read_text()
    rewritten = rewrite(source)
    assert "from lumos.tune.utils.mock_trainable import MyTrainableClass" in rewritten
    assert "ray.tune" not in rewritten
    compile(rewritten, "hyperband_example.py", "exec")


# -- Result.filesystem / get_best_checkpoint -----------------------------------------------


def test_result_filesystem_holds_the_trials_directory(tmp_path: Any) -> None:
    (result,) = _fit(tmp_path, _Saver, "fs")
    fs = result.filesystem
    assert isinstance(fs, fsspec.AbstractFileSystem)
    assert fs.isdir(result.path)
    assert result.checkpoint is not None
    assert fs.exists(result.checkpoint.path)
    assert result.get_best_checkpoint("x", "max") == result.checkpoint
    assert result.get_best_checkpoint("x", "min") == result.best_checkpoints[0][0]
    assert result.get_best_checkpoint("nothing", "max") is None
    with pytest.raises(tune.TuneConfigError, match="mode='low'"):
        result.get_best_checkpoint("x", "low")
    by_hand = tune.Result(metrics={}, config={}, path=str(tmp_path))
    assert by_hand.filesystem.isdir(str(tmp_path))


def test_result_filesystem_of_a_memory_sweep_is_the_memory_filesystem() -> None:
    grid = tune.Tuner(
        _Saver,
        run_config=tune.RunConfig(name="mem", storage_path="memory://ray-names", verbose=0),
        _pool_factory=fake_pool,
    ).fit()
    (result,) = grid
    fs = result.filesystem
    assert "memory" in fs.protocol
    assert fs.isdir(result.path)  # the trial wrote its checkpoint there
    assert result.checkpoint is not None
    assert fs.exists(result.checkpoint.path)


# -- TuneContext, create_scheduler / create_searcher, TuneReportCallback ------------------


def _context_kind(config: dict[str, Any]) -> None:
    ctx = tune.get_context()
    TuneReportCallback()  # fine inside a trial
    tune.report({"loss": 0.0, "is_tune_context": isinstance(ctx, tune.TuneContext)})


def test_tune_context_and_tune_report_callback_inside_a_trial(tmp_path: Any) -> None:
    (result,) = _fit(tmp_path, _context_kind, "ctx")
    assert result.error is None
    assert result.metrics["is_tune_context"] is True
    with pytest.raises(RuntimeError, match="must be used in a Tune session"):
        TuneReportCallback()
    hooks = ("on_start", "on_report", "on_failure", "on_restart", "on_finish")
    assert all(callable(getattr(TuneReportCallback, h)) for h in hooks)  # a Train callback


def test_create_scheduler_and_create_searcher_by_rays_names() -> None:
    asha = tune.create_scheduler("async_hyperband", max_t=10, grace_period=2, not_an_arg=1)
    assert isinstance(asha, tune.schedulers.AsyncHyperBandScheduler)
    pbt = tune.create_scheduler("PBT", hyperparam_mutations={"lr": [0.1, 0.2]})
    assert isinstance(pbt, tune.PopulationBasedTraining)
    assert isinstance(tune.create_scheduler("fifo"), tune.schedulers.FIFOScheduler)
    with pytest.raises(tune.TuneConfigError, match="'pbt'"):
        tune.create_scheduler("pb2")
    with pytest.raises(tune.TuneConfigError, match="must be one of"):
        tune.create_scheduler("nope")
    search = tune.create_searcher("optuna", metric="loss", mode="min", unknown=3)
    assert tune.TuneConfig(search_alg=search).metric == "loss"
    with pytest.raises(tune.TuneConfigError, match="TPESampler"):
        tune.create_searcher("hyperopt")


# -- with_resources / with_parameters return what Ray's return -----------------------------


def train_model(config: dict[str, Any], scale: float = 1.0) -> float:
    return float(config["x"]) * scale


class _Model(tune.Trainable):
    def setup(self, config: dict[str, Any], offset: float = 0.0) -> None:
        self.x = offset

    def step(self) -> dict[str, Any]:
        self.x += 1
        return {"loss": -self.x, "x": self.x, DONE: True}


def test_with_resources_returns_the_function_itself_with_its_resources() -> None:
    def objective(config: dict[str, Any]) -> float:
        return float(config["x"])

    wrapped = tune.with_resources(objective, {"cpu": 2})
    assert wrapped is objective
    assert callable(wrapped)
    assert wrapped({"x": 3}) == 3.0
    assert tune.Tuner(wrapped).tune_config.trial_resources == {"CPU": 2.0}
    # a class: a subclass carrying them, named like it (Ray's ResourceTrainable)
    cls = tune.with_resources(_Model, {"CPU": 3})
    assert issubclass(cls, _Model)
    assert cls.__name__ == "_Model"
    assert tune.Tuner(cls).tune_config.trial_resources == {"CPU": 3.0}
    assert "trial_resources" not in tune.Tuner(_Model).tune_config.model_fields_set
    # a bound method takes no attributes: wrapped in a function
    method = tune.with_resources(tune.stopper.NoopStopper().stop_all, {"CPU": 1})
    assert inspect.isfunction(method)
    with pytest.raises(tune.TuneTypeError, match=r"subclass of tune\.Trainable"):
        tune.with_resources(dict, {"CPU": 1})
    with pytest.raises(tune.TuneTypeError, match="takes no attributes"):
        tune.with_resources(len, {"CPU": 1})


def test_with_resources_class_runs_in_a_tuner(tmp_path: Any) -> None:
    (result,) = _fit(tmp_path, tune.with_resources(_Model, {"CPU": 0.5}), "cls-res")
    assert result.metrics["x"] == 1
    assert result.error is None


def test_rays_snippets_on_real_ray(ray_cluster: Any, tmp_path: Any) -> None:
    # ray.remote(tune.with_resources(f, {...})) works: it is still the function
    remote = ray.remote(tune.with_resources(train_model, {"cpu": 1}))
    assert ray.get(remote.remote({"x": 4})) == 4.0
    # with_parameters gives a new function (config) -> ..., named like the trainable
    with_params = tune.with_parameters(train_model, scale=10.0)
    assert inspect.isfunction(with_params)
    assert with_params.__name__ == "train_model"
    assert with_params({"x": 2}) == 20.0
    assert ray.get(ray.remote(with_params).remote({"x": 3})) == 30.0
    # either order keeps the resources
    both = tune.with_resources(tune.with_parameters(train_model, scale=1.0), {"CPU": 2})
    other = tune.with_parameters(tune.with_resources(train_model, {"CPU": 2}), scale=1.0)
    for trainable in (both, other):
        assert tune.Tuner(trainable).tune_config.trial_resources == {"CPU": 2.0}
    # a class: a subclass whose setup gets the objects (Ray's _Inner)
    cls = tune.with_parameters(_Model, offset=100.0)
    assert issubclass(cls, _Model)
    assert cls.__name__ == "_Model"
    (result,) = _fit(tmp_path, cls, "cls-params")
    assert result.metrics["x"] == 101.0
    with pytest.raises(tune.TuneTypeError, match=r"subclass of tune\.Trainable"):
        tune.with_parameters(dict, data=1)
