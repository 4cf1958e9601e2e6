"""The "waiting for resources" line: only the resources a user can ask for, readably,
and only while the workers' placement is not done (not while their processes start)."""

from __future__ import annotations

from typing import Any

import pytest

from lumos.runtime import WorkerGroupSpec, format_resources, user_resources
from lumos.runtime._internal import messages, placement_wait
from lumos.runtime._internal.placement_wait import (
    WAITING_EVERY_S,
    WAITING_FIRST_S,
    WAITING_STARTING_S,
    _WaitingLines,
)

PG = "d9a8" * 9  # a placement group id as Ray writes it (18 bytes, hex)

# ray.available_resources() on a healthy 4-CPU node while a 2-worker group is placed
RAY_FREE = {
    "CPU": 2.0,
    "GPU": 0.999,
    "memory": 8 * 2**30,
    "object_store_memory": 2.1e9,
    "node:10.0.0.5": 1.0,
    "node:__internal_head__": 1.0,
    "accelerator_type:A100": 1.0,
    f"bundle_group_{PG}": 1999.998,
    f"bundle_group_0_{PG}": 999.999,
    f"bundle_group_1_{PG}": 999.999,
    f"CPU_group_{PG}": 0.0,
    f"CPU_group_0_{PG}": 0.0,
    "special_hardware": 2.0,
}


def test_user_resources_keeps_only_what_a_user_can_ask_for() -> None:
    assert user_resources(RAY_FREE) == {
        "CPU": 2.0,
        "GPU": 0.999,
        "memory": 8 * 2**30,
        "special_hardware": 2.0,
    }
    assert user_resources({}) == {}
    # a custom resource whose name only looks like Ray's placement-group ones stays
    assert user_resources({"my_group_size": 3.0}) == {"my_group_size": 3.0}


def test_format_resources_reads_well() -> None:
    assert format_resources(RAY_FREE) == ("CPU=2, GPU=1, memory=8GiB, special_hardware=2")
    assert format_resources({"CPU": 0.5, "memory": 512 * 2**20}) == "CPU=0.5, memory=512MiB"
    assert format_resources({"CPU": 1.25, "memory": 1.5e9}) == "CPU=1.25, memory=1.4GiB"
    assert format_resources({"CPU": 1 / 3}) == "CPU=0.33"
    assert format_resources({f"bundle_group_0_{PG}": 999.999}) == "none"


def test_waiting_line_names_no_internal_resource() -> None:
    spec = WorkerGroupSpec(num_workers=8, resources_per_worker={"CPU": 1})
    line = messages.waiting_for_resources(spec, 0, 8, RAY_FREE)
    assert line == (
        "waiting for resources: 0 of 8 worker(s) started; requested 8 worker(s) x "
        "{'CPU': 1} (placement_strategy='PACK'); free in the cluster now: "
        "CPU=2, GPU=1, memory=8GiB, special_hardware=2"
    )
    for hidden in ("_group_", "node:", "accelerator_type", "object_store", "999"):
        assert hidden not in line
    assert messages.waiting_for_resources(spec, 0, 8, None).endswith(
        "free in the cluster now: unknown"
    )


def test_elastic_request_names_its_range() -> None:
    spec = WorkerGroupSpec(num_workers=4, min_workers=2, resources_per_worker={"CPU": 1})
    assert "requested 2 (min_workers) to 4 worker(s)" in messages.waiting_for_resources(
        spec, 1, 2, {"CPU": 0.0}
    )


class _Placement:
    """Stands in for ``ray.wait`` on the placement groups' ``ready()`` refs."""

    def __init__(self, placed: bool) -> None:
        self.placed = placed

    def wait(
        self, refs: list[Any], num_returns: int, timeout: float
    ) -> tuple[list[Any], list[Any]]:
        assert timeout == 0
        return (list(refs), []) if self.placed else ([], list(refs))


@pytest.fixture
def placement(monkeypatch: pytest.MonkeyPatch) -> _Placement:
    fake = _Placement(placed=False)
    monkeypatch.setattr(placement_wait.ray, "wait", fake.wait)
    monkeypatch.setattr(placement_wait, "free_resources", lambda: dict(RAY_FREE))
    return fake


def _lines(said: list[str]) -> _WaitingLines:
    spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 1})
    return _WaitingLines(spec, ["ready-ref"], 1, said.append, start=0.0)


def test_unplaced_workers_wait_for_resources_after_the_grace(placement: _Placement) -> None:
    said: list[str] = []
    lines = _lines(said)
    assert lines.due_in(0.0) == WAITING_FIRST_S
    lines.tell(0, 2, WAITING_FIRST_S - 0.1)
    assert said == []
    lines.tell(0, 2, WAITING_FIRST_S)
    assert len(said) == 1
    assert said[0].startswith("waiting for resources: 0 of 2 worker(s) started")
    assert "free in the cluster now: CPU=2, GPU=1" in said[0]
    assert "_group_" not in said[0]
    assert lines.due_in(WAITING_FIRST_S) == WAITING_EVERY_S
    lines.tell(0, 2, WAITING_FIRST_S + WAITING_EVERY_S)
    assert len(said) == 2


def test_placed_workers_that_merely_start_say_nothing_until_they_stall(
    placement: _Placement,
) -> None:
    placement.placed = True
    said: list[str] = []
    lines = _lines(said)
    lines.tell(0, 2, WAITING_FIRST_S)
    assert said == []  # a healthy start whose processes take a while: no line
    assert lines.due_in(WAITING_FIRST_S) == pytest.approx(WAITING_STARTING_S - WAITING_FIRST_S)
    lines.tell(1, 2, WAITING_STARTING_S)
    assert said == [messages.still_starting(1, 2, WAITING_STARTING_S)]
    assert said[0].startswith("workers starting slowly: 1 of 2 worker(s) started after 30 s")
    assert "waiting for resources" not in said[0]


def test_a_failing_on_waiting_is_logged_not_raised(
    placement: _Placement, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(line: str) -> None:
        raise RuntimeError("callback broke")

    spec = WorkerGroupSpec(num_workers=2, resources_per_worker={"CPU": 1})
    lines = _WaitingLines(spec, ["ready-ref"], 1, boom, start=0.0)
    with caplog.at_level("INFO", logger="lumos.runtime"):
        lines.tell(0, 2, WAITING_FIRST_S)
    assert messages.ON_WAITING_FAILED in caplog.text
    assert "waiting for resources" in caplog.text
