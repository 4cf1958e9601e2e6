"""The RunConfig / FailureConfig bases Train and Tune share."""

from __future__ import annotations

import os
import pathlib
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from lumos.runtime import DEFAULT_STORAGE_PATH, FailureConfig, RunConfig


class _Callback:
    pass


class _RunConfig(RunConfig):
    callback_type: ClassVar[type] = _Callback


def test_defaults() -> None:
    fc = FailureConfig()
    assert (fc.max_failures, fc.health_check_timeout_s) == (0, 30.0)
    rc = RunConfig()
    assert rc.name is None
    assert rc.storage_path is None
    assert rc.storage_filesystem is None
    assert rc.failure_config == FailureConfig()
    assert rc.callbacks == []
    assert rc.verbose == 1


@pytest.mark.parametrize(
    ("kwargs", "field", "value", "allowed"),
    [
        ({"max_failures": -2}, "max_failures", "-2", "-1 (retry forever)"),
        (
            {"health_check_timeout_s": 0},
            "health_check_timeout_s",
            "input_value=0",
            "greater than 0",
        ),
        ({"retries": 3}, "retries", "input_value=3", "Extra inputs are not permitted"),
    ],
)
def test_failure_config_errors_name_field_value_and_rule(
    kwargs: dict[str, Any], field: str, value: str, allowed: str
) -> None:
    with pytest.raises(ValueError) as info:
        FailureConfig(**kwargs)
    text = str(info.value)
    assert field in text
    assert value in text
    assert allowed in text


@pytest.mark.parametrize(
    ("kwargs", "field", "value", "allowed"),
    [
        ({"storage_path": 5}, "storage_path", "storage_path=5", "fsspec URL"),
        ({"storage_path": ""}, "storage_path", "storage_path=''", "local directory"),
        ({"storage_filesystem": "s3"}, "storage_filesystem", "'s3'", "fsspec.AbstractFileSystem"),
        ({"callbacks": "cb"}, "callbacks", "callbacks='cb'", "list of"),
        ({"callbacks": [object()]}, "callbacks[0]", "callbacks[0]=<object", "_Callback"),
        ({"verbose": 3}, "verbose", "input_value=3", "less than or equal to 2"),
        ({"name": "a/b"}, "name", "a/b", "separator"),
    ],
)
def test_run_config_errors_name_field_value_and_rule(
    kwargs: dict[str, Any], field: str, value: str, allowed: str
) -> None:
    with pytest.raises(ValueError) as info:
        _RunConfig(**kwargs)
    text = str(info.value)
    assert field in text
    assert value in text
    assert allowed in text


def test_validation_error_is_a_value_error() -> None:
    with pytest.raises(ValidationError):
        FailureConfig(max_failures=-5)


def test_callbacks_checked_against_the_package_callback_type() -> None:
    cb = _Callback()
    assert _RunConfig(callbacks=(cb,)).callbacks == [cb]  # type: ignore[arg-type]
    assert RunConfig(callbacks=[object()]).callbacks != []  # base: any object


def test_verbose_accepts_bools_and_path_likes_become_strings(tmp_path: pathlib.Path) -> None:
    assert RunConfig(verbose=True).verbose == 1
    assert RunConfig(verbose=False).verbose == 0
    assert RunConfig(storage_path=tmp_path).storage_path == str(tmp_path)  # type: ignore[arg-type]


def test_storage_location_own_path_wins() -> None:
    fs = object()
    rc = RunConfig(storage_path="s3://bucket/runs")
    assert rc.storage_location("/parent/trial", fs) == ("s3://bucket/runs", None)


def test_storage_location_parent_then_default() -> None:
    import fsspec

    mem = fsspec.filesystem("memory")
    assert RunConfig().storage_location("/exp/trial_0", mem) == ("/exp/trial_0", mem)
    # resolved on the driver: workers with another HOME write where the run state says
    assert RunConfig().storage_location() == (os.path.expanduser("~/lumos_results"), None)
    assert DEFAULT_STORAGE_PATH == "~/lumos_results"
    own = RunConfig(storage_filesystem=mem)
    assert own.storage_location("/exp/trial_0", object()) == ("/exp/trial_0", mem)
    assert own.storage_location() == (DEFAULT_STORAGE_PATH, mem)


def test_local_storage_paths_are_resolved_by_the_driver(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert RunConfig(storage_path="~/runs").storage_location() == (
        str(tmp_path / "home" / "runs"),
        None,
    )
    assert RunConfig(storage_path="rel/runs").storage_location() == (
        str(tmp_path / "rel" / "runs"),
        None,
    )
    assert RunConfig(storage_path="file:///x/runs").storage_location()[0] == "file:///x/runs"


def test_configs_are_frozen() -> None:
    with pytest.raises(ValidationError):
        FailureConfig().max_failures = 3
