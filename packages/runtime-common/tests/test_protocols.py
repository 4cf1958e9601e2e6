"""WorkerGroup / WorkerPool and their fakes implement the protocols the controllers use.

Checked twice: by mypy (the typed assignments below) and at run time (every protocol
method exists with compatible parameters), so a fake cannot drift from the real class.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from lumos.runtime import (
    GroupFactory,
    PoolFactory,
    WorkerGroup,
    WorkerGroupProtocol,
    WorkerPool,
    WorkerPoolProtocol,
)
from lumos.runtime.testing import FakeCluster, FakeWorkerGroup, FakeWorkerPool


# -- static: mypy checks that each class is assignable to its protocol ---------------
def _group(g: WorkerGroup) -> WorkerGroupProtocol:
    return g


def _fake_group(g: FakeWorkerGroup) -> WorkerGroupProtocol:
    return g


def _pool(p: WorkerPool) -> WorkerPoolProtocol:
    return p


def _fake_pool(p: FakeWorkerPool) -> WorkerPoolProtocol:
    return p


GROUP_FACTORIES: list[GroupFactory] = [
    WorkerGroup.start,
    FakeWorkerGroup.start,
    FakeCluster().start,
]
POOL_FACTORIES: list[PoolFactory] = [WorkerPool, FakeWorkerPool]


# -- run time: the same, by name and signature ----------------------------------------
def _members(proto: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(proto).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def _compatible(impl: Any, spec: Any) -> list[str]:
    """Problems calling ``impl`` the way ``spec`` (a protocol method) may be called."""
    problems: list[str] = []
    want = list(inspect.signature(spec).parameters.values())[1:]  # without self
    have = dict(inspect.signature(impl).parameters)
    for p in want:
        q = have.pop(p.name, None)
        if q is None:
            problems.append(f"missing parameter {p.name!r}")
        elif q.kind != p.kind:
            problems.append(f"parameter {p.name!r} is {q.kind.name}, protocol says {p.kind.name}")
        elif q.default != p.default:
            problems.append(f"parameter {p.name!r} defaults to {q.default!r}, not {p.default!r}")
    have.pop("self", None)
    extra = [n for n, q in have.items() if q.default is inspect.Parameter.empty]
    problems += [f"extra required parameter {n!r}" for n in extra]
    return problems


@pytest.mark.parametrize(
    ("cls", "proto"),
    [
        (WorkerGroup, WorkerGroupProtocol),
        (FakeWorkerGroup, WorkerGroupProtocol),
        (WorkerPool, WorkerPoolProtocol),
        (FakeWorkerPool, WorkerPoolProtocol),
    ],
)
def test_class_implements_protocol(cls: type, proto: type) -> None:
    problems: list[str] = []
    for name, member in _members(proto).items():
        if isinstance(member, property):
            if name in getattr(cls, "__annotations__", {}) or isinstance(
                getattr(cls, name, None), property
            ):
                continue
            init_src = inspect.getsource(cls.__init__)  # type: ignore[misc]
            if f"self.{name}" not in init_src:
                problems.append(f"{name}: no attribute or property")
            continue
        impl = getattr(cls, name, None)
        if impl is None:
            problems.append(f"{name}: missing")
            continue
        problems += [f"{name}: {p}" for p in _compatible(impl, member)]
    assert problems == [], f"{cls.__name__} does not implement {proto.__name__}: {problems}"


def test_protocol_members_are_what_the_controllers_use() -> None:
    assert set(_members(WorkerGroupProtocol)) == {
        "workers",
        "launch",
        "poll",
        "send",
        "request_stop",
        "replace_workers",
        "remove_workers",
        "add_workers",
        "vacate_workers",
        "refill_workers",
        "free_resources",
        "scaling_state",
        "preemption_info",
        "shutdown",
    }
    assert set(_members(WorkerPoolProtocol)) == {
        "add_worker",
        "ready",
        "pending_workers",
        "launch",
        "poll",
        "send",
        "request_stop",
        "remove_worker",
        "shutdown",
    }


def test_a_wrong_signature_is_caught() -> None:
    class Broken:
        def poll(self, timeout: float) -> list[Any]:
            return []

    assert _compatible(Broken.poll, WorkerGroupProtocol.poll) != []
