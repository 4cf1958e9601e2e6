"""tune.with_parameters on a real local Ray cluster: a 50 MB array is put once and shared."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from ray import cloudpickle

from lumos import tune

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def objective(config: dict[str, Any], data: Any = None, scale: float = 0.0) -> None:
    tune.report(
        {
            "loss": float(data[:10].sum()) * scale * config["x"],
            "nbytes": int(data.nbytes),
            "writable": bool(data.flags.writeable),
            "pid": os.getpid(),
        }
    )


def test_with_parameters_puts_a_large_array_once(ray_cluster: Any, tmp_path: Any) -> None:
    data = np.ones(50 * 2**20 // 8)  # 50 MB of float64
    wrapped = tune.with_parameters(objective, data=data, scale=2.0)
    # the wrapper carries object refs, not the array: shipping it to an actor is cheap
    assert len(cloudpickle.dumps(wrapped)) < 100_000
    grid = tune.Tuner(
        wrapped,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=6, max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(name="params", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert grid.num_terminated == 6
    for r in grid:
        assert r.metrics["nbytes"] == data.nbytes
        assert r.metrics["loss"] == 10 * 2.0 * r.config["x"]
        # read from Ray's shared-memory object store (zero-copy), not a pickled copy
        assert r.metrics["writable"] is False
    assert grid.get_dataframe()["pid"].nunique() <= 2  # actors reused across trials
    assert wrapped.__name__ == "objective"


def _assigned(config: dict[str, Any]) -> None:
    import ray

    assigned = ray.get_runtime_context().get_assigned_resources()
    tune.report({"loss": config["cpus"], "cpus": assigned.get("CPU", 0.0), "pid": os.getpid()})


def test_with_resources_of_config_places_each_trial_with_its_resources(
    ray_cluster: Any, tmp_path: Any
) -> None:
    grid = tune.Tuner(
        tune.with_resources(_assigned, lambda config: {"CPU": config["cpus"]}),
        param_space={"cpus": tune.grid_search([1, 2, 1, 2])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
        run_config=tune.RunConfig(name="shapes", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert grid.num_terminated == 4, grid.errors
    for result in grid:  # Ray gave each trial's actor what the function asked for
        assert result.metrics["cpus"] == result.config["cpus"]
