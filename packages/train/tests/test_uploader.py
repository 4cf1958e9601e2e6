"""The ASYNC uploader alone: snapshots, ordering, back-pressure, errors (no Ray)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from lumos.runtime import StopRequested
from lumos.train import CheckpointReportError, CheckpointUploadMode
from lumos.train._internal.uploader import (
    MAX_UPLOADS_IN_FLIGHT,
    Uploader,
    UploadJob,
    snapshot_directory,
)


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 100)
    (root / "sub" / "b.bin").write_bytes(b"b" * 10)
    return root


def test_snapshot_hard_links_every_file_and_outlives_the_source(tmp_path: Path) -> None:
    src = _tree(tmp_path / "ckpt")
    snap = Path(snapshot_directory(str(src)))
    assert snap.parent == src.parent
    assert os.stat(snap / "a.bin").st_ino == os.stat(src / "a.bin").st_ino  # no copy
    shutil.rmtree(src)  # what leaving a TemporaryDirectory block does
    assert (snap / "a.bin").read_bytes() == b"a" * 100
    assert (snap / "sub" / "b.bin").read_bytes() == b"b" * 10


def test_a_missing_directory_says_to_use_mkdtemp(tmp_path: Path) -> None:
    with pytest.raises(CheckpointReportError, match=r"tempfile\.mkdtemp\(\)"):
        snapshot_directory(str(tmp_path / "gone"))


def test_uploads_run_in_order_and_report_errors() -> None:
    done: list[tuple[str, str | None]] = []
    up = Uploader(lambda job, err: done.append((job.dir_name, err and str(err))), lambda: False)

    def fail() -> None:
        raise OSError("disk full")

    for i, fn in enumerate([lambda: None, fail, lambda: None]):
        up.acquire()
        up.submit(UploadJob(i, f"c{i}", fn))
    assert up.wait_idle(30)
    assert done == [("c0", None), ("c1", "disk full"), ("c2", None)]
    up.close(cancel=False)


def test_acquire_blocks_at_the_limit_until_an_upload_ends() -> None:
    release = threading.Event()
    up = Uploader(lambda job, err: None, lambda: False)
    for i in range(MAX_UPLOADS_IN_FLIGHT):
        up.acquire()
        up.submit(UploadJob(i, f"c{i}", lambda: release.wait(30) and None))
    assert up.in_flight == MAX_UPLOADS_IN_FLIGHT
    got = threading.Event()

    def third() -> None:
        up.acquire()
        got.set()

    t = threading.Thread(target=third)
    t.start()
    assert not got.is_set()  # cannot be set before release: both slots are taken
    release.set()
    t.join(30)
    assert got.is_set()
    up.release()
    assert up.wait_idle(30)


def test_a_stop_request_ends_a_wait_for_a_slot() -> None:
    release = threading.Event()
    stop = threading.Event()
    up = Uploader(lambda job, err: None, stop.is_set)
    for i in range(MAX_UPLOADS_IN_FLIGHT):
        up.acquire()
        up.submit(UploadJob(i, f"c{i}", lambda: release.wait(30) and None))
    stop.set()
    with pytest.raises(StopRequested):
        up.acquire()
    release.set()
    assert up.wait_idle(30)


def test_upload_mode_defaults_match_ray() -> None:
    assert CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
    assert not CheckpointUploadMode.SYNC.default_delete_local_checkpoint_after_upload()
    assert not CheckpointUploadMode.NO_UPLOAD.default_delete_local_checkpoint_after_upload()
