"""RunStorage contract, run against local disk, memory:// and S3 (moto server)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from lumos.storage import (
    AttemptRecord,
    CheckpointConfig,
    CheckpointRecord,
    InvalidNameError,
    RetentionPolicy,
    RunState,
    RunStateError,
    RunStorage,
)


def test_layout_and_uri(location) -> None:
    storage = location.storage("run-1")
    assert storage.name == "run-1"
    assert storage.run_path.endswith("/run-1")
    assert storage.state_dir == storage.run_path + "/_lumos"
    assert storage.checkpoint_path("epoch=2") == storage.run_path + "/epoch=2"
    if location.backend == "local":
        assert storage.uri == storage.run_path
        assert os.path.isabs(storage.uri)
    elif location.backend == "s3":
        assert storage.uri == f"s3://{storage.run_path}"
    again = RunStorage(storage.uri.rsplit("/", 1)[0], "run-1", location.fresh_fs())
    assert again.run_path == storage.run_path
    child = storage.child("trial_0")
    assert child.run_path == storage.run_path + "/trial_0"
    assert child.fs is storage.fs


def test_state_round_trip(location) -> None:
    storage = location.storage()
    assert storage.load_state() is None
    assert not storage.exists()
    state = RunState(
        name="run",
        attempts=[AttemptRecord(index=0, status="errored", error="boom", ended_at=2.0)],
        report_count=3,
        extra={"config": {"lr": 0.1}},
    )
    storage.save_state(state)
    assert storage.exists()
    reader = RunStorage(location.storage_path, "run", location.fresh_fs())
    loaded = reader.load_state()
    assert loaded == state
    assert loaded is not None
    assert loaded.latest() is None
    assert loaded.attempts[0].error == "boom"


def test_save_state_rejects_a_state_of_another_run(location) -> None:
    with pytest.raises(ValueError, match="does not match"):
        location.storage("a").save_state(RunState(name="b"))


def test_newer_schema_and_corrupt_state_are_clear_errors(location) -> None:
    storage = location.storage()
    storage.save_state(RunState(name="run"))
    doc = json.loads(storage.fs.cat_file(storage.state_path))
    doc["schema_version"] = 99
    storage.fs.pipe_file(storage.state_path, json.dumps(doc).encode())
    with pytest.raises(RunStateError, match="newer lumos-storage"):
        storage.load_state()
    storage.fs.pipe_file(storage.state_path, b'{"schema_version": 1, "na')
    with pytest.raises(RunStateError, match="not valid JSON"):
        storage.load_state()
    storage.fs.pipe_file(storage.state_path, b'{"schema_version": 1, "name": "run", "status": "?"}')
    with pytest.raises(RunStateError, match="status"):
        storage.load_state()


def test_persist_commit_and_list(location, make_local_dir) -> None:
    storage = location.storage()
    ckpt = storage.persist_directory(make_local_dir({"w.bin": b"1", "sub/x": b"2"}), "ckpt_0")
    assert ckpt.path == storage.checkpoint_path("ckpt_0")
    assert storage.list_uncommitted() == ["ckpt_0"]  # persisted but not committed
    record = CheckpointRecord(dir_name="ckpt_0", metrics={"loss": 1.0}, report_index=4)
    state, deleted = storage.commit_checkpoint(RunState(name="run"), record)
    assert deleted == []
    assert state.latest() == record
    assert state.report_count == 5
    assert storage.list_uncommitted() == []
    assert storage.load_state() == state
    assert [c.path for c in storage.list_checkpoints()] == [ckpt.path]


def test_ranks_merge_into_one_checkpoint(location, make_local_dir) -> None:
    storage = location.storage()
    storage.persist_directory(make_local_dir({"rank_0.pt": b"0", "common/meta": b"m"}), "c")
    storage.persist_directory(make_local_dir({"rank_1.pt": b"1"}), "c")
    with storage.checkpoint("c").as_directory() as d:
        found = sorted(
            os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs
        )
    assert found == ["common/meta", "rank_0.pt", "rank_1.pt"]


def test_many_files_are_uploaded(location, make_local_dir) -> None:
    files = {f"shard_{i % 3}/part_{i:03d}": os.urandom(1024) for i in range(60)}
    storage = location.storage()
    seen: list[str] = []
    storage.persist_directory(make_local_dir(files), "c", on_file_done=seen.append)
    assert sorted(seen) == sorted(files)
    with storage.checkpoint("c").as_directory() as d:
        for rel, data in files.items():
            assert Path(d, rel).read_bytes() == data


def test_commit_applies_retention_after_writing_state(location, make_local_dir) -> None:
    storage = location.storage()
    policy = RetentionPolicy(num_to_keep=2, score_attribute="loss", score_order="min")
    state = RunState(name="run")
    all_deleted: list[str] = []
    for i, loss in enumerate([0.5, 0.1, 0.3, 0.9]):
        storage.persist_directory(make_local_dir({"f": str(i).encode()}), f"c{i}")
        record = CheckpointRecord(dir_name=f"c{i}", metrics={"loss": loss}, report_index=i)
        state, deleted = storage.commit_checkpoint(state, record, policy)
        all_deleted += deleted
    # kept: best two (c1, c2) + the latest (c3)
    assert all_deleted == ["c0"]
    assert state.checkpoint_names() == ["c1", "c2", "c3"]
    assert state.latest_checkpoint == "c3"
    assert storage.load_state() == state
    location.fresh_fs().invalidate_cache()
    assert not location.fresh_fs().exists(storage.checkpoint_path("c0"))
    assert location.fresh_fs().exists(storage.checkpoint_path("c1") + "/f")
    assert storage.list_uncommitted() == []


def test_recommit_of_same_dir_replaces_record(location, make_local_dir) -> None:
    storage = location.storage()
    storage.persist_directory(make_local_dir({"f": b"x"}), "c")
    state, _ = storage.commit_checkpoint(RunState(name="run"), CheckpointRecord(dir_name="c"))
    state, _ = storage.commit_checkpoint(
        state, CheckpointRecord(dir_name="c", metrics={"v": 2}, report_index=1)
    )
    assert len(state.checkpoints) == 1
    assert state.checkpoints[0].metrics == {"v": 2}


def test_delete_uncommitted_respects_reserved(location, make_local_dir) -> None:
    storage = location.storage()
    storage.persist_directory(make_local_dir({"f": b"x"}), "committed")
    state, _ = storage.commit_checkpoint(
        RunState(name="run"), CheckpointRecord(dir_name="committed")
    )
    storage.persist_directory(make_local_dir({"f": b"partial"}), "partial_upload")
    trial = storage.child("trial_0")
    trial.save_state(RunState(name="trial_0"))
    assert storage.list_uncommitted() == ["partial_upload", "trial_0"]
    assert storage.list_uncommitted(reserved=["trial_0"]) == ["partial_upload"]
    assert storage.delete_uncommitted(reserved={"trial_0"}) == ["partial_upload"]
    assert storage.list_uncommitted(reserved=["trial_0"]) == []
    assert trial.load_state() == RunState.model_validate(trial.load_state().model_dump())
    assert storage.load_state() == state
    with storage.checkpoint("committed").as_directory() as d:
        assert Path(d, "f").read_bytes() == b"x"


def test_list_uncommitted_on_a_run_that_does_not_exist(location) -> None:
    storage = location.storage("never")
    assert storage.list_uncommitted() == []
    assert storage.delete_uncommitted() == []


def test_json_documents(location) -> None:
    storage = location.storage()
    assert storage.read_json("tune/study.json") is None
    storage.write_json("tune/study.json", {"trials": [1, 2]})
    storage.write_json("tune/study.json", {"trials": [1, 2, 3]})
    assert RunStorage(location.storage_path, "run", location.fresh_fs()).read_json(
        "tune/study.json"
    ) == {"trials": [1, 2, 3]}
    for bad in ["../escape.json", "/abs.json", "a//b.json", ""]:
        with pytest.raises(InvalidNameError):
            storage.write_json(bad, {})


def test_metrics_chunks_keep_order_and_are_immutable(location) -> None:
    storage = location.storage()
    assert storage.read_metrics() == []
    storage.append_metrics([{"i": 0}, {"i": 1}], start_index=0)
    storage.append_metrics([{"i": 2}], start_index=2)
    storage.append_metrics([], start_index=3)  # nothing to write
    storage.append_metrics([{"i": 3}, {"i": 4}], start_index=3)
    reader = RunStorage(location.storage_path, "run", location.fresh_fs())
    assert [r["i"] for r in reader.read_metrics()] == [0, 1, 2, 3, 4]
    chunk_dir = storage.state_dir + "/metrics"
    assert len(location.fresh_fs().ls(chunk_dir)) == 3  # one new file per append
    # resumed from a checkpoint taken at report 2: history from index 2 on is replaced
    storage.append_metrics([{"i": 20}], start_index=2)
    assert [r["i"] for r in reader.read_metrics()] == [0, 1, 20]
    with pytest.raises(ValueError, match="start_index"):
        storage.append_metrics([{"i": 0}], start_index=-1)


def test_run_storage_pickles(location) -> None:
    storage = location.storage()
    storage.save_state(RunState(name="run", report_count=7))
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.run_path == storage.run_path
    state = clone.load_state()
    assert state is not None
    assert state.report_count == 7


def test_local_state_write_leaves_no_temp_files(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "run")
    for i in range(5):
        storage.save_state(RunState(name="run", report_count=i))
    assert sorted(os.listdir(storage.state_dir)) == ["run_state.json"]


def test_local_persist_into_existing_dir_overwrites_files(tmp_path: Path, make_local_dir) -> None:
    storage = RunStorage(tmp_path / "runs", "run")
    storage.persist_directory(make_local_dir({"f": b"old"}), "c")
    storage.persist_directory(make_local_dir({"f": b"new"}), "c")
    assert Path(storage.checkpoint_path("c"), "f").read_bytes() == b"new"


@pytest.mark.parametrize("move_files", [False, True])
def test_local_persist_fsyncs_every_file_and_the_folders_naming_them(
    tmp_path: Path, make_local_dir, monkeypatch: pytest.MonkeyPatch, move_files: bool
) -> None:
    """A checkpoint on local disk is on disk when persist_directory returns (power loss
    included): every file and every folder whose entries changed was fsynced, whether
    its files were copied or hard-linked."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    storage = RunStorage(tmp_path / "runs", "run")
    files = {"model.pt": b"m" * 1000, "sub/deeper/opt.pt": b"o", "sub/rng": b"r"}
    ckpt = storage.persist_directory(make_local_dir(files), "c", move_files=move_files)
    root = Path(ckpt.path)
    expected_files = {str(root / rel) for rel in files}
    expected_dirs = {str(root), str(root.parent), str(root / "sub"), str(root / "sub/deeper")}
    assert expected_files | expected_dirs <= set(synced)
    # the folders after their files: a name is durable only once its file is
    assert max(synced.index(f) for f in expected_files) < min(
        synced.index(d) for d in expected_dirs
    )


def test_move_files_links_each_file_into_a_local_run_instead_of_copying(
    location, make_local_dir
) -> None:
    files = {"__0_0.distcp": b"s" * 4096, "sub/.metadata": b"m"}
    src = make_local_dir(files)
    storage = location.storage("run")
    ckpt = storage.persist_directory(src, "c", move_files=True)
    if location.backend == "local":  # the same inode: no second copy was written
        assert all(os.path.samefile(src / rel, Path(ckpt.path, rel)) for rel in files)
    for rel in files:  # the caller deletes its directory: the checkpoint keeps the files
        (src / rel).unlink()
    restored = ckpt.to_directory()
    assert {rel: Path(restored, rel).read_bytes() for rel in files} == files


def test_move_files_replaces_a_file_an_earlier_try_left(tmp_path: Path, make_local_dir) -> None:
    storage = RunStorage(tmp_path / "runs", "run")
    storage.persist_directory(make_local_dir({"f": b"half"}), "c")
    src = make_local_dir({"f": b"whole"})
    storage.persist_directory(src, "c", move_files=True)
    storage.persist_directory(src, "c", move_files=True)  # and again: nothing changes
    target = Path(storage.checkpoint_path("c"), "f")
    assert target.read_bytes() == b"whole"
    assert os.path.samefile(src / "f", target)


def test_move_files_copies_a_file_that_has_another_name(tmp_path: Path, make_local_dir) -> None:
    src = make_local_dir({"f": b"shared"})
    elsewhere = tmp_path / "cache-f"
    os.link(src / "f", elsewhere)  # the caller's directory does not own this file alone
    storage = RunStorage(tmp_path / "runs", "run")
    ckpt = storage.persist_directory(src, "c", move_files=True)
    assert not os.path.samefile(elsewhere, Path(ckpt.path, "f"))
    elsewhere.write_bytes(b"rewritten")  # rewriting it later leaves the checkpoint alone
    assert Path(ckpt.path, "f").read_bytes() == b"shared"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_move_files_copies_across_filesystems(tmp_path: Path) -> None:
    src = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        if os.stat(src).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the same filesystem as the test's directory")
        (src / "f").write_bytes(b"data")
        storage = RunStorage(tmp_path / "runs", "run")
        ckpt = storage.persist_directory(src, "c", move_files=True)  # EXDEV: copied
        assert not os.path.samefile(src / "f", Path(ckpt.path, "f"))
        assert Path(ckpt.path, "f").read_bytes() == b"data"
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_persist_directory_requires_a_directory(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path / "runs", "run")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        storage.persist_directory(tmp_path / "missing", "c")


def test_persist_empty_directory_creates_the_checkpoint_dir(location, make_local_dir) -> None:
    storage = location.storage()
    ckpt = storage.persist_directory(make_local_dir({}), "empty")
    if location.backend == "local":
        assert os.path.isdir(ckpt.path)
    assert storage.checkpoint_path("empty") == ckpt.path


def test_commit_can_leave_the_dropped_checkpoints_for_later(location, make_local_dir) -> None:
    storage = location.storage()
    keep_one = CheckpointConfig(num_to_keep=1).retention()
    state = RunState(name="run")
    for i in range(2):
        storage.persist_directory(make_local_dir({"w.bin": b"x"}), f"c{i}")
        record = CheckpointRecord(dir_name=f"c{i}", metrics={}, report_index=i)
        state, dropped = storage.commit_checkpoint(state, record, keep_one, delete_dropped=False)
    assert dropped == ["c0"]
    assert storage.load_state().checkpoint_names() == ["c1"]  # the state no longer names c0
    assert storage.list_uncommitted() == ["c0"]  # still there: a restore would remove it
    storage.delete_checkpoints(dropped)
    assert storage.list_uncommitted() == []
    assert [c.path for c in storage.list_checkpoints()] == [storage.checkpoint_path("c1")]


def test_merge_metrics_patches_one_row_until_it_is_reported_again(location) -> None:
    storage = location.storage()
    storage.append_metrics([{"i": 0}, {"i": 1}, {"i": 2}], start_index=0)
    storage.merge_metrics(1, {"val": 0.5})
    storage.merge_metrics(9, {"val": 0.7})  # a row not in the history: ignored
    reader = RunStorage(location.storage_path, "run", location.fresh_fs())
    assert reader.read_metrics() == [{"i": 0}, {"i": 1, "val": 0.5}, {"i": 2}]
    storage.append_metrics([{"i": 10}], start_index=1)  # resumed before report 1
    assert reader.read_metrics() == [{"i": 0}, {"i": 10}]
    with pytest.raises(ValueError, match="index"):
        storage.merge_metrics(-1, {})


def test_update_checkpoints_writes_state_then_applies_retention(location, make_local_dir) -> None:
    storage = location.storage()
    state = RunState(name="run")
    policy = RetentionPolicy(num_to_keep=1, score_attribute="val", score_order="min")
    for i in range(3):
        storage.persist_directory(make_local_dir({"f": b"x"}), f"c{i}")
        pending = CheckpointRecord(dir_name=f"c{i}", report_index=i, validation_status="pending")
        state, dropped = storage.commit_checkpoint(state, pending, policy)
        assert dropped == []  # nothing is judged while its validation is pending
    records = [
        r.model_copy(update={"validation_status": "validated", "metrics": {"val": v}})
        for r, v in zip(state.checkpoints, [0.3, 0.1, 0.2], strict=True)
    ]
    state, dropped = storage.update_checkpoints(state, records, "c2", policy)
    assert dropped == ["c0"]
    assert storage.load_state() == state
    assert state.checkpoint_names() == ["c1", "c2"]
    assert [c.path for c in storage.list_checkpoints()] == [
        storage.checkpoint_path("c1"),
        storage.checkpoint_path("c2"),
    ]


def test_rename_checkpoint(location, make_local_dir) -> None:
    storage = location.storage()
    storage.persist_directory(make_local_dir({"a/f": b"1"}), "c")
    storage.rename_checkpoint("c", "c.rolled-back-1")
    fs = location.fresh_fs()
    assert not fs.exists(storage.checkpoint_path("c"))
    assert fs.cat_file(storage.checkpoint_path("c.rolled-back-1") + "/a/f") == b"1"
    storage.rename_checkpoint("missing", "other")  # nothing to move


def test_delete_uncommitted_aborts_multipart_uploads_a_killed_writer_left(s3: Any) -> None:
    # Soak finding: a worker killed mid-upload left an S3 multipart upload "in
    # progress" forever (its parts kept, never completed or aborted).
    bucket = s3.create_bucket()
    fs = s3.filesystem()
    storage = RunStorage(f"{bucket}/runs", "mp", fs)
    other = RunStorage(f"{bucket}/runs", "other-run", fs)
    backend = fs

    def start(key: str) -> None:
        backend.call_s3("create_multipart_upload", Bucket=bucket, Key=key)

    start("runs/mp/step=40/shard-0.pt")
    start("runs/other-run/step=1/shard-0.pt")  # another run's: left alone
    storage.delete_uncommitted()
    out = backend.call_s3("list_multipart_uploads", Bucket=bucket)
    assert [u["Key"] for u in out.get("Uploads", [])] == ["runs/other-run/step=1/shard-0.pt"]
    assert other.delete_uncommitted() == []
    out = backend.call_s3("list_multipart_uploads", Bucket=bucket)
    assert out.get("Uploads", []) == []
