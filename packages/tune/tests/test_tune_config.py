"""Config validation: bad values fail at construction, naming field, value and what is allowed."""

from __future__ import annotations

import os
from typing import Any

import optuna
import pytest
from pydantic import ValidationError

from lumos import tune


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metric": "loss", "mode": "minimize"}, "mode must be 'min' or 'max', got 'minimize'"),
        (
            {"metric": ["a", "b"], "mode": ["min", "best"]},
            "mode must be 'min' or 'max', got 'best'",
        ),
        ({"metric": "loss", "mode": "min", "num_samples": 0}, "num_samples must be >= 1"),
        ({"num_samples": -2}, "num_samples must be >= 1, or -1"),
        ({"num_samples": -1}, "num_samples=-1 runs until time_budget_s"),
        ({"mode": "min"}, "mode='min' is set but metric is not"),
        ({"metric": "loss"}, "metric='loss' needs mode"),
        ({"metric": ["a", "b"], "mode": "min"}, "give both as lists"),
        ({"metric": ["a", "b"], "mode": ["min"]}, "must have the same length"),
        ({"metric": ["a", "a"], "mode": ["min", "min"]}, "names a metric twice"),
        ({"max_concurrent_trials": 0}, "max_concurrent_trials"),
        ({"trial_resources": {"CPU": -1}}, "amounts must be numbers >= 0"),
        ({"stop": {"loss": "low"}}, "bounds must be numbers"),
        (
            {"metric": ["a", "b"], "mode": ["min", "max"], "pruner": optuna.pruners.MedianPruner()},
            "cannot prune a multi-objective search",
        ),
        ({"time_budget_s": 0}, "time_budget_s"),
        ({"health_check_timeout_s": 0}, "health_check_timeout_s"),
        ({"health_check_timeout_s": -5.0}, "health_check_timeout_s"),
    ],
)
def test_tune_config_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tune.TuneConfig(**kwargs)


def test_tune_config_rejects_an_unknown_field_by_name() -> None:
    with pytest.raises(tune.TuneConfigError, match="no field 'unknown'") as info:
        tune.TuneConfig(unknown=1)
    assert isinstance(info.value, ValueError)


def test_tune_config_accepts_single_and_multi_objective() -> None:
    single = tune.TuneConfig(metric="loss", mode="max")
    assert single.metrics == ["loss"]
    assert single.directions() == ["maximize"]
    multi = tune.TuneConfig(metric=["loss", "latency"], mode=["min", "max"])
    assert multi.multi_objective
    assert multi.directions() == ["minimize", "maximize"]
    assert tune.TuneConfig().directions() == ["minimize"]


def test_trial_resources_accept_a_cpu_count() -> None:
    assert tune.TuneConfig(trial_resources=0).trial_resources == {"CPU": 0.0}
    assert tune.TuneConfig(trial_resources=0.5).trial_resources == {"CPU": 0.5}
    assert tune.TuneConfig(trial_resources={"CPU": 1, "GPU": 1}).trial_resources == {
        "CPU": 1.0,
        "GPU": 1.0,
    }


def test_run_config_validates_name_and_callbacks() -> None:
    with pytest.raises(ValidationError, match=r"RunConfig\.name"):
        tune.RunConfig(name="a/b")
    with pytest.raises(ValidationError, match=r"callbacks must be tune\.Callback instances"):
        tune.RunConfig(callbacks=[object()])
    with pytest.raises(ValidationError, match="verbose"):
        tune.RunConfig(verbose=3)
    with pytest.raises(ValidationError, match="max_failures"):
        tune.FailureConfig(max_failures=-2)
    with pytest.raises(ValidationError, match="checkpoint_score_order"):
        tune.CheckpointConfig(checkpoint_score_order="best")  # type: ignore[arg-type]


def test_checkpoint_config_maps_to_a_retention_policy() -> None:
    policy = tune.CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
    ).retention()
    assert (policy.num_to_keep, policy.score_attribute, policy.score_order) == (2, "loss", "min")


def test_tuner_rejects_a_non_callable_trainable() -> None:
    with pytest.raises(TypeError, match="trainable must be a function"):
        tune.Tuner(42)  # type: ignore[arg-type]
    with pytest.raises(tune.TuneTypeError, match="trainable must be a function"):
        tune.Tuner(42)  # type: ignore[arg-type]


def _objective(config: dict[str, Any]) -> None:
    return None


def test_trial_actors_get_a_tolerant_configurable_health_check() -> None:
    # A trial actor driving a Train run on a loaded machine can answer late: the pool
    # Tune creates must not use the runtime's 10 s default.
    assert tune.TuneConfig().health_check_timeout_s == 30.0
    assert tune.FailureConfig().health_check_timeout_s == 30.0
    default_pool = tune.Tuner(_objective)._make_pool({"CPU": 1})
    # The setting lives in FailureConfig (shared with Train) ...
    custom_pool = tune.Tuner(
        _objective,
        run_config=tune.RunConfig(
            failure_config=tune.FailureConfig(health_check_timeout_s=90, max_failures=1)
        ),
    )._make_pool({"CPU": 1})
    # ... and TuneConfig's old field still works, with a FutureWarning naming the new place.
    with pytest.warns(FutureWarning, match=r"FailureConfig\(health_check_timeout_s=\.\.\.\)"):
        deprecated = tune.TuneConfig(health_check_timeout_s=90)
    assert deprecated.health_check_timeout_s == 90
    alias_pool = tune.Tuner(_objective, tune_config=deprecated)._make_pool({"CPU": 1})
    try:
        assert getattr(default_pool, "health_check_timeout_s", None) == 30.0
        assert getattr(custom_pool, "health_check_timeout_s", None) == 90.0
        assert getattr(alias_pool, "health_check_timeout_s", None) == 90.0
    finally:
        default_pool.shutdown()
        custom_pool.shutdown()
        alias_pool.shutdown()


def test_failure_config_is_the_runtimes_and_wins_over_the_deprecated_alias() -> None:
    from lumos import runtime

    assert issubclass(tune.FailureConfig, runtime.FailureConfig)
    assert issubclass(tune.RunConfig, runtime.RunConfig)
    assert tune.RunConfig.callback_type is tune.Callback
    with pytest.warns(FutureWarning, match="deprecated"):
        tc = tune.TuneConfig(health_check_timeout_s=90)
    explicit = tune.FailureConfig(health_check_timeout_s=45)
    assert tc.effective_health_check_timeout_s(explicit) == 45
    assert tc.effective_health_check_timeout_s(tune.FailureConfig()) == 90
    assert tune.TuneConfig().effective_health_check_timeout_s(explicit) == 45
    # A runtime FailureConfig is accepted and becomes tune's.
    runtime_failure_config = runtime.FailureConfig(max_failures=2)
    rc = tune.RunConfig(failure_config=runtime_failure_config)  # type: ignore[arg-type]
    assert isinstance(rc.failure_config, tune.FailureConfig)
    assert rc.failure_config.max_failures == 2
    # storage_path: unset means ~/lumos_results, as before.
    assert tune.RunConfig().storage_location() == (os.path.expanduser("~/lumos_results"), None)
    with pytest.raises(ValidationError, match="health_check_timeout_s"):
        tune.FailureConfig(health_check_timeout_s=0)
