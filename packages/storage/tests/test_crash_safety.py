"""SIGKILL a driver in the middle of a checkpoint upload and of a state write.

The last committed state must be intact; the partial upload must be found by
``list_uncommitted`` and removed by ``delete_uncommitted``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from storage_test_helpers import Child

from lumos.storage import RunStorage
from lumos.storage.testing import S3Server

CRASH_BACKENDS = ["local", "s3"]  # memory:// does not outlive a process


@pytest.fixture(params=CRASH_BACKENDS)
def crash_location(request: pytest.FixtureRequest, tmp_path: Path):
    """(storage_path, endpoint, filesystem factory) for a store another process can reach."""
    if request.param == "local":
        return str(tmp_path / "runs"), "", lambda: None
    server: S3Server = request.getfixturevalue("s3")
    bucket = server.create_bucket()
    return f"{bucket}/runs", server.endpoint_url, server.filesystem


def test_kill_during_checkpoint_upload(crash_location, children) -> None:
    storage_path, endpoint, make_fs = crash_location
    child = Child("checkpoint", storage_path, "run", endpoint)
    children.append(child)
    child.wait_for("COMMITTED")
    child.wait_for("UPLOADING")
    child.kill()

    storage = RunStorage(storage_path, "run", make_fs())
    state = storage.load_state()
    assert state is not None
    assert state.latest_checkpoint == "ckpt_0"
    assert state.checkpoint_names() == ["ckpt_0"]
    partial = storage.fs.find(storage.checkpoint_path("ckpt_1"))
    assert 5 <= len(partial) < 200  # the upload really was cut off in the middle
    assert storage.list_uncommitted() == ["ckpt_1"]
    assert storage.delete_uncommitted() == ["ckpt_1"]
    assert storage.list_uncommitted() == []
    storage.fs.invalidate_cache()
    assert not storage.fs.exists(storage.checkpoint_path("ckpt_1"))
    with storage.checkpoint("ckpt_0").as_directory() as d:
        assert Path(d, "weights.bin").read_bytes() == b"committed" * 1000


# Kill points: "tmp" waits until a temporary state file exists (local disk: a
# write is in progress); a number kills that many ms after the child announced
# the next write, so different rounds hit serialisation, write, fsync and rename.
KILL_POINTS = {
    "local": ["tmp", 0.0, 1.0, 2.0, 4.0, 7.0, 10.0, 15.0, 20.0, 30.0, 45.0],
    "s3": [0.0, 5.0, 20.0],
}


def _kill_during_state_write(child: Child, state_dir: str, point: str | float) -> None:
    child.wait_for("WRITING 2")
    if point == "tmp":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(".tmp-" in n for n in os.listdir(state_dir)):
                break
            time.sleep(0.001)
    else:
        child.wait_for("WRITING 3")
        time.sleep(float(point) / 1000)  # deliberate kill point, not a wait for an event
    child.kill()


def test_kill_during_state_write(crash_location, children) -> None:
    storage_path, endpoint, make_fs = crash_location
    backend = "s3" if endpoint else "local"
    for point in KILL_POINTS[backend]:
        child = Child("state", storage_path, "run", endpoint)
        children.append(child)
        child.wait_for("COMMITTED")
        _kill_during_state_write(child, os.path.join(storage_path, "run", "_lumos"), point)

        storage = RunStorage(storage_path, "run", make_fs())
        state = storage.load_state()  # must parse: old or new, never torn
        assert state is not None
        assert state.checkpoint_names() == ["ckpt_0"]
        assert state.latest_checkpoint == "ckpt_0"
        assert state.report_count >= 1
        if state.report_count > 1:
            assert len(state.extra["payload"]) == 8 * 1024 * 1024
        assert storage.list_uncommitted() == []
        storage.delete_uncommitted()
        if not endpoint:
            assert [n for n in os.listdir(storage.state_dir) if ".tmp-" in n] == []
