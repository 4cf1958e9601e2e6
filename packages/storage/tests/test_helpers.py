"""The small helpers lumos.storage publishes for its siblings."""

from __future__ import annotations

import json
import pathlib

import fsspec
import pytest

from lumos.storage import Lease, LeaseHeldError, RunStorage, is_local, json_default, to_jsonable


class _Scalar:
    """Stands for a numpy or torch scalar: a value with ``.item()``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


class _BrokenItem:
    def item(self) -> float:
        raise ValueError("only one element tensors can be converted")

    def __repr__(self) -> str:
        return "<tensor of 3>"


def test_json_default_turns_scalars_and_paths_into_json() -> None:
    text = json.dumps(
        {"loss": _Scalar(0.25), "path": pathlib.PurePosixPath("/a/b"), "t": _BrokenItem()},
        default=json_default,
    )
    assert json.loads(text) == {"loss": 0.25, "path": "/a/b", "t": "<tensor of 3>"}


def test_to_jsonable_keeps_plain_values_and_converts_the_rest() -> None:
    out = to_jsonable({"a": 1, "b": 2.5, "c": "x", "d": None, "e": True, "f": _Scalar(3.0)})
    assert out == {"a": 1, "b": 2.5, "c": "x", "d": None, "e": True, "f": 3.0}
    assert type(out["e"]) is bool


def test_is_local() -> None:
    assert is_local(fsspec.filesystem("file"))
    assert not is_local(fsspec.filesystem("memory"))


def test_leased_holds_and_always_releases_the_lease(tmp_path) -> None:
    storage = RunStorage(tmp_path, "run")
    seen: list[Lease] = []

    def work() -> None:
        with storage.leased("driver-1") as lease:
            seen.append(lease)
            assert not lease.released
            with pytest.raises(LeaseHeldError, match="driver-1"):
                storage.acquire_lease()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        work()
    assert seen[0].released
    storage.acquire_lease().release()  # free again after the error
