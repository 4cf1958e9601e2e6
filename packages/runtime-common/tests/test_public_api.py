"""lumos.runtime's public names: one table, __all__ derived from it, every name loads."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

import lumos.runtime as runtime
from lumos.runtime import lazy_attributes


def test_all_is_derived_from_the_table() -> None:
    table = runtime._LAZY
    assert runtime.__all__ == sorted(
        {*table, "__version__", "context", "lazy_attributes", "worker"}
    )


@pytest.mark.parametrize("name", runtime.__all__)
def test_every_public_name_loads(name: str) -> None:
    assert getattr(runtime, name) is not None
    assert name in dir(runtime)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        runtime.Nope


def test_lazy_attributes_loads_on_first_use_and_caches() -> None:
    namespace: dict[str, object] = {}
    getattr_, dir_, all_ = lazy_attributes(
        "pkg", {"dumps": "json", "path": "os.path"}, namespace, eager=("__version__",)
    )
    assert all_ == ["__version__", "dumps", "path"]
    import json

    assert getattr_("dumps") is json.dumps
    assert namespace["dumps"] is json.dumps
    assert "dumps" in dir_()
    assert "__version__" in dir_()
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'loads'"):
        getattr_("loads")


def test_a_submodule_entry_loads_the_module() -> None:
    fake = types.ModuleType("pkg_under_test.sub")
    fake.marker = 42  # type: ignore[attr-defined]
    sys.modules["pkg_under_test.sub"] = fake
    try:
        getattr_, _, all_ = lazy_attributes("pkg_under_test", {"sub": "pkg_under_test.sub"}, {})
        assert all_ == ["sub"]
        assert getattr_("sub") is fake
    finally:
        del sys.modules["pkg_under_test.sub"]
    assert runtime.testing is importlib.import_module("lumos.runtime.testing")


def test_misuse_raises_the_runtime_subclasses() -> None:
    from lumos.runtime import RuntimeConfigError, RuntimeUsageError, WorkerGroupSpec, context
    from lumos.runtime.testing import FakeWorkerGroup

    with pytest.raises(RuntimeUsageError, match="JobContext"), context.running("x"):  # type: ignore[arg-type]
        pass
    with pytest.raises(RuntimeConfigError, match="num_workers"):
        WorkerGroupSpec(num_workers=0)
    with FakeWorkerGroup(WorkerGroupSpec(num_workers=2)) as group:
        with pytest.raises(RuntimeConfigError, match="per_rank_kwargs has 1 entries"):
            group.launch(lambda: None, per_rank_kwargs=[{}])


def test_misuse_errors_are_builtins_too() -> None:
    assert issubclass(runtime.RuntimeConfigError, runtime.LumosRuntimeError)
    assert issubclass(runtime.RuntimeConfigError, ValueError)
    assert issubclass(runtime.RuntimeUsageError, runtime.LumosRuntimeError)
    assert issubclass(runtime.RuntimeUsageError, TypeError)
    assert issubclass(runtime.StopRequested, runtime.LumosRuntimeError)
