"""Ray's stop semantics on a real Ray cluster, in the shapes of Ray's own guides.

The first report that meets a stop criterion (a ``stop`` dict, a function, a
``Stopper``, ``max_t``, a pruner) is the trial's final result; nothing after it is
recorded, and the function is stopped at its next ``report``. Ray's guide loops forever
and reports ``mean_accuracy = i / 10``: every trial must end at iteration 8.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import optuna
import pytest
from ray import cloudpickle

from lumos import tune
from lumos.tune.schedulers import ASHAScheduler

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def my_trainable(config: dict[str, Any]) -> None:
    i = 1
    while True:
        tune.report({"mean_accuracy": i / 10})
        i += 1


def stop_fn(trial_id: str, result: dict[str, Any]) -> bool:
    return bool(result["mean_accuracy"] >= 0.8)


class CustomStopper(tune.stopper.Stopper):
    """Ray's guide: stop every trial once any trial reached the accuracy."""

    def __init__(self) -> None:
        self.should_stop = False

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if not self.should_stop and result["mean_accuracy"] >= 0.8:
            self.should_stop = True
        return self.should_stop

    def stop_all(self) -> bool:
        return self.should_stop


class PruneAtFive(optuna.pruners.BasePruner):
    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return (trial.last_step or 0) >= 5


def _fit(tmp_path: Any, name: str, **kw: Any) -> tune.ResultGrid:
    tune_config = tune.TuneConfig(num_samples=kw.pop("num_samples", 1), **kw.pop("tc", {}))
    run_config = tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0, **kw)
    return tune.Tuner(my_trainable, tune_config=tune_config, run_config=run_config).fit()


def _ends_at(grid: tune.ResultGrid, iteration: int) -> None:
    assert not grid.errors
    for result in grid:
        assert result.metrics["training_iteration"] == iteration, result.metrics
        assert result.metrics["mean_accuracy"] == pytest.approx(iteration / 10)
        frame = result.metrics_dataframe
        assert list(frame["training_iteration"]) == list(range(1, iteration + 1))


def test_the_guides_stop_dict_ends_a_hundred_trials_at_eight(
    ray_cluster: Any, tmp_path: Any
) -> None:
    stop = {"training_iteration": 10, "mean_accuracy": 0.8}
    grid = _fit(tmp_path, "dict", stop=stop, num_samples=100)
    assert len(grid) == 100
    _ends_at(grid, 8)


@pytest.mark.parametrize("kind", ["function", "stopper", "max_t"])
def test_driver_side_criteria_end_every_trial_at_the_report_that_met_them(
    ray_cluster: Any, tmp_path: Any, kind: str
) -> None:
    # Judged by the driver: without a verdict per report the function ran on for
    # thousands of reports before the stop landed (2108, 1888, ...).
    if kind == "max_t":
        tc = {"metric": "mean_accuracy", "mode": "max", "scheduler": ASHAScheduler(max_t=8)}
        grid = _fit(tmp_path, kind, num_samples=20, tc=tc)
    else:
        stop = stop_fn if kind == "function" else CustomStopper()
        grid = _fit(tmp_path, kind, stop=stop, num_samples=1 if kind == "stopper" else 20)
    _ends_at(grid, 8)


def test_a_pruned_trials_last_result_is_the_one_the_pruner_judged(
    ray_cluster: Any, tmp_path: Any
) -> None:
    tc = {"metric": "mean_accuracy", "mode": "max", "pruner": PruneAtFive()}
    grid = _fit(tmp_path, "pruned", num_samples=10, tc=tc)
    for result in grid:
        assert result.metrics["training_iteration"] == 5
        assert len(result.metrics_dataframe) == 5


def test_time_budget_records_nothing_after_the_stop(ray_cluster: Any, tmp_path: Any) -> None:
    # A trial whose worker starts after the budget ran out ends with no result at all
    # (as Ray's). Every trial that reported keeps exactly the rows up to its last result,
    # none after it; each sweep below is checked so. The budget is wall time from the
    # sweep's start, which a loaded machine can spend before any trial reports: then the
    # next sweep gets twice the budget, so that the check is not vacuous.
    for budget in (5, 10, 20, 40):
        grid = _fit(tmp_path, f"budget-{budget}", num_samples=2, tc={"time_budget_s": budget})
        for result in grid:
            frame = result.metrics_dataframe
            if "training_iteration" not in result.metrics:
                assert len(frame) == 0, frame
                continue
            last = int(result.metrics["training_iteration"])
            assert list(frame["training_iteration"]) == list(range(1, last + 1))
            assert result.metrics["mean_accuracy"] == pytest.approx(last / 10)
        if any("training_iteration" in r.metrics for r in grid):
            return
    raise AssertionError(f"no trial reported within a {budget} s budget: {list(grid)}")


def flaky(config: dict[str, Any]) -> None:
    if config["x"] == 1:
        raise ValueError("bad x")
    for i in range(1000):
        tune.report({"loss": float(i)})
        time.sleep(0.01)


def test_fail_fast_true_returns_the_grid_and_raise_raises(ray_cluster: Any, tmp_path: Any) -> None:
    # Ray's FailureConfig guide: fail_fast=True ends the experiment, fit() returns.
    space = {"x": tune.grid_search([0, 1, 2, 3])}
    tuner = tune.Tuner(
        flaky,
        param_space=space,
        run_config=tune.RunConfig(
            name="ff",
            storage_path=str(tmp_path),
            verbose=0,
            failure_config=tune.FailureConfig(fail_fast=True),
        ),
    )
    grid = tuner.fit()
    assert len(grid.errors) == 1
    assert "bad x" in str(grid.errors[0])
    assert all(r.metrics.get("training_iteration", 0) < 1000 for r in grid if r.error is None)

    tuner = tune.Tuner(
        flaky,
        param_space=space,
        run_config=tune.RunConfig(
            name="ff-raise",
            storage_path=str(tmp_path),
            verbose=0,
            failure_config=tune.FailureConfig(fail_fast="raise"),
        ),
    )
    with pytest.raises(tune.TuneFailedError, match="bad x"):
        tuner.fit()


def test_a_time_total_s_stop_bound_fires(ray_cluster: Any, tmp_path: Any) -> None:
    # Ray fills in time_total_s in every result; a stop on it must end the trial.
    def slow(config: dict[str, Any]) -> None:
        while True:
            tune.report({"x": 1})
            time.sleep(0.05)

    tuner = tune.Tuner(
        slow,
        run_config=tune.RunConfig(
            name="time", storage_path=str(tmp_path), verbose=0, stop={"time_total_s": 1.0}
        ),
    )
    (result,) = tuner.fit()
    assert result.metrics["time_total_s"] >= 1.0
    assert result.metrics["training_iteration"] < 200
