from __future__ import annotations

import pickle

import pytest

from lumos.storage import InvalidNameError, RunStorage, StorageError, validate_name


@pytest.mark.parametrize(
    "value",
    ["run-42", "epoch=3", "checkpoint_000001", "a.b", "trial_0_lr=0.01", "名前", "x" * 255],
)
def test_valid_names_pass_unchanged(value: str) -> None:
    assert validate_name(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("/abs", "absolute"),
        ("\\abs", "absolute"),
        ("C:evil", "absolute"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("a\nb", "control character"),
        ("a\x00b", "control character"),
        ("tab\there", "control character"),
        ("\x7f", "control character"),
        (".", "current directory"),
        ("~user", "home directory"),
        ("_lumos", "reserved"),
        ("x" * 256, "256 characters"),
    ],
)
def test_invalid_names_are_rejected_with_field_value_and_rule(value: str, reason: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name(value, field="checkpoint_dir_name")
    msg = str(info.value)
    assert f"checkpoint_dir_name={value!r}" in msg
    assert reason in msg
    assert "Allowed:" in msg
    assert info.value.field == "checkpoint_dir_name"
    assert info.value.value == value


def test_non_string_is_rejected() -> None:
    with pytest.raises(InvalidNameError, match="expected a string, got int"):
        validate_name(3)


def test_invalid_name_error_is_value_error_and_storage_error_and_pickles() -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_name("a/b", field="name")
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, StorageError)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is InvalidNameError
    assert str(clone) == str(err)
    assert (clone.field, clone.value, clone.reason) == (err.field, err.value, err.reason)


def test_run_storage_validates_name_and_checkpoint_dir_name(tmp_path) -> None:
    with pytest.raises(InvalidNameError, match=r"name='\.\./escape'"):
        RunStorage(tmp_path, "../escape")
    storage = RunStorage(tmp_path, "ok")
    with pytest.raises(InvalidNameError, match="checkpoint_dir_name='_lumos'"):
        storage.checkpoint_path("_lumos")
    with pytest.raises(InvalidNameError, match="checkpoint_dir_name='/etc'"):
        storage.persist_directory(tmp_path, "/etc")
    with pytest.raises(InvalidNameError):
        storage.child("a/b")
