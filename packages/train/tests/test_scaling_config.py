"""ScalingConfig's elastic and local-mode fields, RunConfig(worker_runtime_env): bad input
fails with a clear message; what the trainer does with the good ones (no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import run_config
from pydantic import ValidationError

from lumos import train
from lumos.runtime.testing import FakeCluster


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_workers": (3, 2)}, ["num_workers=(3, 2)", "1 <= min_workers <= max_workers"]),
        ({"num_workers": (0, 2)}, ["num_workers=(0, 2)", "min_workers=0"]),
        ({"num_workers": -1}, ["num_workers=-1", "int >= 1", "0 (local mode"]),
        ({"num_workers": 2.0}, ["num_workers=2.0", "int >= 0", "tuple of two ints"]),
        ({"num_workers": "2"}, ["num_workers='2'", "int >= 0"]),
        ({"num_workers": True}, ["num_workers=True", "int >= 0"]),
        ({"num_workers": (1, 2, 3)}, ["num_workers=(1, 2, 3)", "tuple of two ints"]),
        ({"num_workers": (1, 2.5)}, ["num_workers=(1, 2.5)", "tuple of two ints"]),
        (
            {"elastic_resize_monitor_interval_s": -1},
            ["elastic_resize_monitor_interval_s=-1", "> 0"],
        ),
        ({"elastic_resize_monitor_interval_s": 0}, ["elastic_resize_monitor_interval_s=0", "> 0"]),
        ({"elastic_resize_monitor_interval_s": "5"}, ["elastic_resize_monitor_interval_s='5'"]),
        (
            {"trainer_resources": {"CPU": 1}},
            ["trainer_resources={'CPU': 1}", "controller in the process that calls fit()"],
        ),
    ],
)
def test_bad_scaling_config(kwargs: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        train.ScalingConfig(**kwargs)
    for word in words:
        assert word in str(info.value)
    assert isinstance(info.value, ValueError)


def test_good_scaling_config() -> None:
    sc = train.ScalingConfig(num_workers=(2, 3), elastic_resize_monitor_interval_s=2)
    assert (sc.min_workers, sc.max_workers, sc.elasticity_enabled) == (2, 3, True)
    assert sc.elastic_resize_monitor_interval_s == 2.0
    assert train.ScalingConfig().elastic_resize_monitor_interval_s == 60.0  # Ray's default
    fixed = train.ScalingConfig(num_workers=[2, 2])
    assert (fixed.num_workers, fixed.elasticity_enabled) == ((2, 2), False)
    assert train.ScalingConfig(num_workers=0).local_mode
    assert not train.ScalingConfig(num_workers=1).local_mode


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"envvars": {"A": "1"}}, ["unknown key(s) 'envvars'", "env_vars", "working_dir", "pip"]),
        ({"env_vars": {"A": 1}}, ["worker_runtime_env['env_vars']['A']=1", "str"]),
        ({"working_dir": 3}, ["worker_runtime_env['working_dir']=3", "must be a str"]),
        ({"pip": 3}, ["worker_runtime_env['pip']=3", "list of requirements"]),
        ("env_vars", ["worker_runtime_env='env_vars'", "must be a dict"]),
    ],
)
def test_bad_worker_runtime_env(env: Any, words: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        train.RunConfig(worker_runtime_env=env)
    for word in words:
        assert word in str(info.value)


def _two_reports() -> None:
    train.report({"size": train.get_context().get_world_size()})


def test_equal_range_runs_as_fixed_and_runtime_env_reaches_the_group_spec(tmp_path: Path) -> None:
    cluster = FakeCluster()
    env = {"env_vars": {"LUMOS_TEST_VAR": "42"}}
    result = train.DataParallelTrainer(
        _two_reports,
        scaling_config=train.ScalingConfig(num_workers=(2, 2)),
        run_config=run_config(tmp_path, "fixed", worker_runtime_env=env),
        _group_factory=cluster.start,
    ).fit()
    assert result.metrics == {"size": 2}
    assert [(s.num_workers, s.runtime_env) for s in cluster.specs] == [(2, env)]
