"""A new ``WorkerGroup.start`` removes the lumos placement groups of Ray jobs that ended.

The soak found the case (seed 20261201): a Tune driver was SIGKILLed; Ray marked its job
finished and removed the job's placement groups, then killed the job's actors. One trial
actor, whose workers that cascade had just killed, was restarting them and created a new
group 34 ms after the removal. Ray accepted it and keeps it for good: nothing in Ray
removes a group of a job that has already ended.

That exact interleaving cannot be timed in a test, so a second driver process leaves the
state it ends in: a lumos-named group (``lifetime="detached"``, so that Ray's end-of-job
removal passes it by as it passed the late group) whose job is dead. A real Ray cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import ray
from ray._raylet import PlacementGroupID
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from lumos.runtime import WorkerGroup, WorkerGroupSpec

pytestmark = pytest.mark.usefixtures("no_leaks")

_CHILD = """
import sys, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], log_to_driver=False)
pg = placement_group([{"CPU": 0.01}], name=sys.argv[2], lifetime="detached")
ray.get(pg.ready(), timeout=60)
print(ray.get_runtime_context().get_job_id(), flush=True)
"""


def _alive(name: str) -> bool:
    table: dict[str, Any] = ray.util.placement_group_table()
    return any(
        info.get("name") == name and info.get("state") != "REMOVED" for info in table.values()
    )


def _group_left_by_an_ended_job(name: str) -> None:
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, address, name],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    job = out.stdout.strip().splitlines()[-1]
    from ray._private.state import jobs

    deadline = time.monotonic() + 30.0
    while not any(j["JobID"] == job and j["IsDead"] for j in jobs()):
        assert time.monotonic() < deadline, f"job {job} still alive 30 s after its driver exited"
        time.sleep(0.2)
    assert _alive(name)


def test_a_group_start_removes_lumos_groups_of_ended_jobs_and_keeps_the_rest() -> None:
    orphan = f"lumos-wg-{uuid.uuid4().hex[:24]}02000000-{uuid.uuid4().hex}"
    _group_left_by_an_ended_job(orphan)
    # A group of a live job (this test's) and a group of an ended job not named by lumos
    # are not lumos's to remove.
    own_name = f"lumos-wg-driver-{uuid.uuid4().hex}"
    own = placement_group([{"CPU": 0.01}], name=own_name)
    foreign = f"user-detached-{uuid.uuid4().hex}"
    _group_left_by_an_ended_job(foreign)
    try:
        with WorkerGroup.start(WorkerGroupSpec(num_workers=1)) as group:
            assert not _alive(orphan), "the ended job's lumos group is still alive"
            assert _alive(ray.util.placement_group_table(group.placement_group)["name"])
            assert _alive(own_name), "a live job's group was removed"
            assert _alive(foreign), "a group lumos did not name was removed"
    finally:
        remove_placement_group(own)
        for pg_id, info in ray.util.placement_group_table().items():
            if info.get("name") in (orphan, foreign) and info.get("state") != "REMOVED":
                remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
