"""Search space conversion: every distribution, nesting, grids, define-by-run, bad input."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from lumos import tune
from lumos.tune._internal.search_space import SearchSpace


def _samples(space: SearchSpace, n: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.sample(trial))
        study.tell(trial, 0.0)
    return out


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        (tune.uniform(-1.0, 2.0), FloatDistribution(-1.0, 2.0)),
        (tune.quniform(0.0, 1.0, 0.25), FloatDistribution(0.0, 1.0, step=0.25)),
        (tune.loguniform(1e-4, 1e-1), FloatDistribution(1e-4, 1e-1, log=True)),
        (tune.qloguniform(1.0, 100.0, 5.0), FloatDistribution(1.0, 100.0, log=True)),
        (tune.randint(1, 5), IntDistribution(1, 4)),
        (tune.qrandint(0, 10, 5), IntDistribution(0, 10, step=5)),
        (tune.lograndint(1, 1000), IntDistribution(1, 999, log=True)),
        (tune.choice(["a", "b"]), CategoricalDistribution(["a", "b"])),
        (tune.grid_search([1, 2, 3]), CategoricalDistribution([1, 2, 3])),
    ],
)
def test_every_domain_maps_to_its_optuna_distribution(domain: Any, expected: Any) -> None:
    space = SearchSpace({"p": domain})
    assert space.distributions() == {"p": expected}


def test_sampled_values_respect_bounds_steps_and_exclusive_highs() -> None:
    space = SearchSpace(
        {
            "u": tune.uniform(-1.0, 2.0),
            "q": tune.quniform(0.0, 1.0, 0.25),
            "lu": tune.loguniform(1e-4, 1e-1),
            "qlu": tune.qloguniform(1.0, 100.0, 5.0),
            "ri": tune.randint(1, 3),
            "qri": tune.qrandint(0, 10, 5),
            "lri": tune.lograndint(1, 4),
        }
    )
    for c in _samples(space, 80):
        assert -1.0 <= c["u"] <= 2.0
        assert c["q"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert 1e-4 <= c["lu"] <= 1e-1
        assert math.isclose(c["qlu"] / 5.0, round(c["qlu"] / 5.0)) or c["qlu"] in (1.0, 100.0)
        assert c["ri"] in (1, 2)  # high is exclusive, like Ray Tune
        assert c["qri"] in (0, 5, 10)  # high is inclusive for qrandint, like Ray Tune
        assert c["lri"] in (1, 2, 3)
    seen = {c["ri"] for c in _samples(space, 80)}
    assert seen == {1, 2}


def test_quniform_trims_high_to_the_last_grid_point_without_warning() -> None:
    space = SearchSpace({"q": tune.quniform(0.0, 1.1, 0.5)})
    assert space.distributions()["q"] == FloatDistribution(0.0, 1.0, step=0.5)
    assert {c["q"] for c in _samples(space, 40)} <= {0.0, 0.5, 1.0}


def test_choice_of_objects_is_stored_by_index_and_returned_as_objects() -> None:
    options = [{"layers": 1}, {"layers": 2}, [3, 4]]
    space = SearchSpace({"arch": tune.choice(options)})
    assert space.distributions()["arch"] == CategoricalDistribution([0, 1, 2])
    values = [c["arch"] for c in _samples(space, 40)]
    assert all(v in options for v in values)
    assert len({repr(v) for v in values}) == 3


def test_nested_dicts_lists_and_constants() -> None:
    space = SearchSpace(
        {
            "model": {
                "lr": tune.loguniform(1e-3, 1e-1),
                "act": "relu",
                "sizes": [tune.randint(1, 4), 8],
            },
            "epochs": 3,
        }
    )
    assert set(space.distributions()) == {"model/lr", "model/sizes/0"}
    for c in _samples(space, 10):
        assert c["epochs"] == 3
        assert c["model"]["act"] == "relu"
        assert c["model"]["sizes"][1] == 8
        assert c["model"]["sizes"][0] in (1, 2, 3)


def test_optuna_distributions_are_accepted_directly() -> None:
    space = SearchSpace(
        {
            "x": FloatDistribution(0, 1),
            "n": IntDistribution(1, 3),
            "c": CategoricalDistribution(["a"]),
        }
    )
    for c in _samples(space, 5):
        assert 0 <= c["x"] <= 1
        assert c["n"] in (1, 2, 3)
        assert c["c"] == "a"


def test_grid_points_enumerate_the_cartesian_product() -> None:
    space = SearchSpace(
        {"a": tune.grid_search([1, 2]), "b": {"c": tune.grid_search(["x", "y", "z"])}}
    )
    assert space.num_grid_points == 6
    points = [space.grid_params(i) for i in range(6)]
    assert {(p["a"], p["b/c"]) for p in points} == {(a, c) for a in (1, 2) for c in "xyz"}
    assert space.grid_params(6) == space.grid_params(0)  # repeats with num_samples > 1


def test_define_by_run_space_and_replay_from_params() -> None:
    def space_fn(trial: optuna.Trial) -> dict[str, Any]:
        kind = trial.suggest_categorical("kind", ["linear", "mlp"])
        config: dict[str, Any] = {"kind": kind, "const": 7}
        if kind == "mlp":
            config["width"] = trial.suggest_int("width", 4, 64, log=True)
        return config

    space = SearchSpace(space_fn)
    samples = _samples(space, 40)
    assert {c["kind"] for c in samples} == {"linear", "mlp"}
    for c in samples:
        assert ("width" in c) == (c["kind"] == "mlp")
        assert c["const"] == 7
    # rebuilding a config from stored params (restore) gives the same config
    replay = space.config_from_params({"kind": "mlp", "width": 16})
    assert replay == {"kind": "mlp", "const": 7, "width": 16}


def test_define_by_run_returning_none_uses_the_params() -> None:
    space = SearchSpace(lambda t: t.suggest_float("x", 0, 1) and None)
    (config,) = _samples(space, 1)
    assert set(config) == {"x"}


def test_config_from_params_for_dict_spaces() -> None:
    space = SearchSpace(
        {"lr": tune.loguniform(1e-3, 1e-1), "arch": tune.choice([[1], [2]]), "k": 1}
    )
    assert space.config_from_params({"lr": 0.01, "arch": 1}) == {"lr": 0.01, "arch": [2], "k": 1}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tune.uniform(1.0, 0.0), "uniform(low=1.0, high=0.0): low must be <= high"),
        (lambda: tune.loguniform(0.0, 1.0), "a log scale needs low > 0"),
        (lambda: tune.quniform(0.0, 1.0, 0.0), "q must be > 0"),
        (lambda: tune.randint(5, 5), "randint(low=5, high=5): high is exclusive"),
        (lambda: tune.randint(1.5, 5), "low must be an int"),  # type: ignore[arg-type]
        (lambda: tune.lograndint(0, 5), "a log scale needs low >= 1"),
        (lambda: tune.qrandint(10, 0, 2), "the range is empty"),
        (lambda: tune.choice([]), "give at least one category"),
        (lambda: tune.choice("abc"), "must be a list or tuple"),  # type: ignore[arg-type]
        (lambda: tune.uniform(0.0, float("inf")), "high must be finite"),
        (lambda: SearchSpace([1, 2]), "param_space must be a dict"),  # type: ignore[arg-type]
        (lambda: SearchSpace({1: tune.uniform(0, 1)}), "keys must be strings"),  # type: ignore[dict-item]
        (lambda: SearchSpace({"f": {"g": len}}), "is a function"),
    ],
)
def test_bad_input_fails_at_construction_with_a_clear_message(make: Any, message: str) -> None:
    with pytest.raises(
        tune.SearchSpaceError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        make()


def test_search_space_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        tune.uniform(2, 1)
