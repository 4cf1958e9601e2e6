"""What makes the dashboard cheap on object stores, and the records it shows (no Ray).

The storage path's index (``run_index``), the history's folded segments
(``metrics_segments``), the deleted-checkpoint log, the chart thinning, and over HTTP:
the root page from the index, structured failures, a hang's stacks, deleted checkpoints.
Run on local disk and ``memory://`` (the contract suite runs the rest on moto S3).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import request

from lumos.storage import (
    AttemptRecord,
    CheckpointRecord,
    FailureRecord,
    RetentionPolicy,
    RunState,
    RunStorage,
    WorkerRecord,
)
from lumos.storage._internal import checkpoint_log, metrics_log, run_index
from lumos.storage._internal.dashboard_series import chart_columns
from lumos.storage._internal.dashboard_server import Dashboard, make_server
from lumos.storage._internal.metrics_segments import HistoryWriter
from lumos.storage._internal.run_view import open_location

ROOTS = ["local", "memory"]


def _root(kind: str, tmp_path: Path) -> str:
    return str(tmp_path / "root") if kind == "local" else f"memory://idx-{time.time_ns()}"


def _files(storage: RunStorage, folder: str) -> list[str]:
    return sorted(str(p) for p in storage.fs.find(folder))


@pytest.mark.parametrize("kind", ROOTS)
def test_each_save_leaves_one_record_per_run_spelled_in_its_name(kind: str, tmp_path: Path) -> None:
    root = _root(kind, tmp_path)
    storage = RunStorage(root, "run-a")
    state = RunState(name="run-a", attempts=[AttemptRecord(index=0)])
    storage.save_state(state)
    storage.append_metrics([{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)], 0)
    storage.save_state(state.model_copy(update={"status": "finished"}))
    folder = run_index.index_folder(storage.storage_path, "run-a")
    [path] = _files(storage, folder)
    record = run_index.record_from_name(path.rsplit("/", 1)[-1], "run-a")
    assert record is not None
    assert (record["status"], record["reports"], record["attempts"]) == ("finished", 5, 1)
    assert record["best"] == {"metric": "loss", "value": 0.2, "mode": "latest", "report": 4}
    # a resumed driver (a new RunStorage) keeps the history's figures until it appends
    RunStorage(root, "run-a").save_state(state.model_copy(update={"status": "running"}))
    again = run_index.read_index(storage.fs, storage.storage_path)["run-a"]
    assert (again["status"], again["reports"], again["best"]["value"]) == ("running", 5, 0.2)
    assert len(_files(storage, folder)) == 1


def test_commits_that_change_only_counts_rewrite_the_record_at_most_every_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a SYNC commit saves the state: it must not also pay for the index every time
    storage = RunStorage(str(tmp_path / "root"), "run-a")
    writes: list[str] = []
    real = run_index.fsu.atomic_write_bytes
    monkeypatch.setattr(
        run_index.fsu, "atomic_write_bytes", lambda fs, p, d: (writes.append(p), real(fs, p, d))
    )
    state = RunState(name="run-a", status="running", attempts=[AttemptRecord(index=0)])
    for i in range(5):  # five commits in a row: one record
        storage.save_state(state.model_copy(update={"report_count": i + 1}))
    assert len([w for w in writes if "/_lumos/index/" in w]) == 1
    two = state.model_copy(update={"attempts": [AttemptRecord(index=0), AttemptRecord(index=1)]})
    storage.save_state(two)  # a new attempt is written at once
    storage.save_state(two.model_copy(update={"status": "finished"}))  # and a new status
    assert len([w for w in writes if "/_lumos/index/" in w]) == 3
    record = run_index.read_index(storage.fs, storage.storage_path)["run-a"]
    assert (record["status"], record["attempts"]) == ("finished", 2)


def test_a_record_too_long_for_a_name_is_read_from_its_file(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "long")
    storage.append_metrics([{"loss_" + "x" * 300: 1.5}], 0)
    storage.save_state(RunState(name="long"))
    [path] = _files(storage, run_index.index_folder(storage.storage_path, "long"))
    assert path.endswith("-_.json")
    assert run_index.read_index(storage.fs, storage.storage_path)["long"]["best"]["value"] == 1.5


def test_the_newest_of_several_records_wins_and_other_files_are_ignored(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "run")
    folder = Path(run_index.index_folder(storage.storage_path, "run"))
    folder.mkdir(parents=True)
    old = run_index.build_record(RunState(name="run", status="errored"), 1, None)
    new = run_index.build_record(RunState(name="run", status="finished"), 2, None)
    for seq, record in ((5, old), (9, new), (7, old)):
        (folder / run_index.record_file_name(seq, record, 200)).write_text(json.dumps(record))
    (folder / "notes.txt").write_text("not a record")
    (folder / "x-y.json").write_text("{}")  # no write time: not a record either
    torn = Path(run_index.index_folder(storage.storage_path, "torn"))
    torn.mkdir()
    (torn / "00000000000000000001-_.json").write_text('{"v": 1, "na')  # a torn long record
    index = run_index.read_index(storage.fs, storage.storage_path)
    assert set(index) == {"run"}  # "torn" is read the slow way
    assert (index["run"]["status"], index["run"]["reports"]) == ("finished", 2)
    assert index["run"]["name"] == "run"


def test_an_index_that_cannot_be_written_never_fails_the_state_write(tmp_path: Path) -> None:
    (tmp_path / "_lumos").mkdir()
    (tmp_path / "_lumos" / "index").write_text("a file where the folder would go")
    storage = RunStorage(tmp_path, "run")
    storage.save_state(RunState(name="run", status="finished"))
    loaded = storage.load_state()
    assert loaded is not None
    assert loaded.status == "finished"


@pytest.mark.parametrize("kind", ROOTS)
def test_folded_segments_hold_the_same_history_in_fewer_files(kind: str, tmp_path: Path) -> None:
    fs, root = open_location(_root(kind, tmp_path))
    folded, plain = f"{root}/folded", f"{root}/plain"
    writer = HistoryWriter(fs, folded, segment_chunks=3, segment_rows=7)
    script: list[tuple[str, Any]] = []
    for start in range(0, 20, 2):
        script.append(("rows", ([{"i": i, "a": start} for i in range(start, start + 2)], start)))
        if start == 8:
            script.append(("merge", (5, {"val": 1.0})))  # a validation of an earlier row
        if start == 12:
            script.append(("rows", ([{"i": i, "again": True} for i in range(10, 13)], 10)))
    script.append(("merge", (18, {"val": 2.0})))
    for op, (a, b) in script:
        if op == "rows":
            writer.append(a, b)
            metrics_log.write_rows(fs, plain, a, b)
        else:
            writer.merge(a, b)
            metrics_log.write_merge(fs, plain, a, b)
    expected = metrics_log.read_history(fs, plain)
    assert metrics_log.read_history(fs, folded) == expected
    # the rewind to 10 came after row 13: 14 follows 12 (what replay says, folded or not)
    assert [r["i"] for r in expected] == [*range(13), *range(14, 20)]
    assert expected[10].get("again")
    assert expected[5]["val"] == 1.0
    assert expected[18]["val"] == 2.0
    assert len(fs.ls(folded, detail=False)) < len(fs.ls(plain, detail=False)) / 2


def test_a_reader_never_sees_a_torn_history_while_chunks_are_folded(tmp_path: Path) -> None:
    fs, root = open_location(str(tmp_path))
    folder = f"{root}/metrics"
    writer = HistoryWriter(fs, folder, segment_chunks=4, segment_rows=50)
    done = threading.Event()
    seen: list[list[int]] = []

    def read() -> None:
        while not done.is_set():
            seen.append([r["i"] for r in metrics_log.read_history(fs, folder)])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for start in range(0, 300, 3):
            writer.append([{"i": i} for i in range(start, start + 3)], start)
    finally:
        done.set()
        reader.join()
    assert all(ids == list(range(len(ids))) for ids in seen)  # always a gapless prefix
    assert [r["i"] for r in metrics_log.read_history(fs, folder)] == list(range(300))


def test_retention_drops_are_logged_in_the_same_state_write(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "run")
    state = RunState(name="run")
    for i in range(4):
        (tmp_path / f"src{i}").mkdir()
        (tmp_path / f"src{i}" / "w").write_text("x")
        storage.persist_directory(tmp_path / f"src{i}", f"ckpt_{i}")
        record = CheckpointRecord(dir_name=f"ckpt_{i}", report_index=i, metrics={"loss": i})
        state, _ = storage.commit_checkpoint(state, record, RetentionPolicy(num_to_keep=2))
    loaded = storage.load_state()
    assert loaded is not None
    assert loaded.checkpoint_names() == ["ckpt_2", "ckpt_3"]
    deleted = loaded.deleted_checkpoints
    assert [(d.dir_name, d.report_index, d.reason) for d in deleted] == [
        ("ckpt_0", 0, "retention"),
        ("ckpt_1", 1, "retention"),
    ]
    assert deleted[0].metrics == {"loss": 0}
    many = checkpoint_log.with_dropped(deleted, [loaded.checkpoints[0]] * 500)
    assert len(many) == checkpoint_log.MAX_DELETED


def test_a_long_history_is_thinned_but_keeps_every_buckets_extremes() -> None:
    rows: list[dict[str, Any]] = [{"loss": 1.0, "step": i} for i in range(100_000)]
    rows[54_321]["loss"] = 1e9  # a spike
    rows[77_777]["loss"] = float("nan")  # not a number: a gap
    rows[88_888]["loss"] = -5.0
    out = chart_columns(rows)
    assert out["thinned"]
    assert out["steps"] == 100_000
    assert len(out["x"]) <= 5 * 1000
    assert out["x"][-1] == 99_999
    by_step = dict(zip(out["x"], out["series"]["loss"], strict=True))
    assert by_step[54_321] == 1e9
    assert by_step[88_888] == -5.0
    assert 77_777 not in by_step or by_step[77_777] is None
    short = chart_columns(rows[:50])
    assert not short["thinned"]
    assert short["x"] == list(range(50))


# -- over HTTP -----------------------------------------------------------------------------


def _hung_run(root: Path) -> RunStorage:
    storage = RunStorage(str(root), "hung")
    t0 = time.time() - 50
    failure = FailureRecord(
        rank=1, kind="hung", node_id="ab" * 8, node_ip="10.0.0.7", pid=77,
        error_type="lumos.train.RankStuckError", message="stuck at train.py:9 in step",
        stacks="hangs/attempt-0",
    )  # fmt: skip
    workers = [WorkerRecord(rank=r, node_ip=f"10.0.0.{6 + r}") for r in (0, 1)]
    attempts = [
        AttemptRecord(index=0, started_at=t0, ended_at=t0 + 9, status="errored",
                      error=failure.message, failures=[failure], ended_by="hang",
                      restart="first launch", workers=workers),
        AttemptRecord(index=1, started_at=t0 + 10, ended_at=t0 + 20, status="finished",
                      restart="new group", workers=workers),
    ]  # fmt: skip
    storage.append_metrics([{"step": i, "loss": 1.0} for i in range(6)], 0)
    state = RunState(name="hung", status="finished", created_at=t0, attempts=attempts)
    for i in range(3):
        (root / f"c{i}").mkdir()
        (root / f"c{i}" / "w").write_text("x")
        storage.persist_directory(root / f"c{i}", f"checkpoint_{i}")
        record = CheckpointRecord(dir_name=f"checkpoint_{i}", report_index=i)
        state, _ = storage.commit_checkpoint(state, record, RetentionPolicy(num_to_keep=1))
    hangs = Path(storage.state_dir) / "hangs" / "attempt-0"
    hangs.mkdir(parents=True)
    finding = {"culprits": [1], "where": {"1": "train.py:9 in step"}, "why": {"1": "<b>x</b>"},
               "nodes": {"1": "ab" * 8}, "stalled_s": 3.5}  # fmt: skip
    (hangs / "hang.json").write_text(json.dumps(finding))
    for r in (0, 1):
        (hangs / f"rank-{r}.txt").write_text(f"Thread main (rank {r}):\n  File train.py, line 9")
    return storage


@pytest.fixture
def port(tmp_path: Path) -> Any:
    root = tmp_path / "root"
    root.mkdir()
    _hung_run(root)
    old = RunStorage(str(root), "old")  # a run stored before the index: no record
    old.save_state(RunState(name="old", status="errored"))
    for path in Path(run_index.index_folder(str(root), "old")).iterdir():
        path.unlink()
    fs, native = open_location(str(root))
    server = make_server(Dashboard(fs, native), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def test_root_rows_come_from_the_index_and_an_unindexed_run_is_still_listed(port: int) -> None:
    status, doc, _ = request(port, "/api/root")
    assert status == 200
    assert doc["indexed"] == 1
    rows = {r["name"]: r for r in doc["rows"]}
    assert set(rows) == {"hung", "old"}
    hung = rows["hung"]
    assert (hung["status"], hung["reports"], hung["checkpoints"], hung["attempts"]) == (
        "finished", 6, 1, 2,
    )  # fmt: skip
    assert hung["best"]["metric"] == "loss"
    assert hung["rel"] == "hung"
    assert rows["old"]["status"] == "errored"


def test_run_page_shows_structured_failures_the_hang_and_deleted_checkpoints(port: int) -> None:
    status, run, _ = request(port, "/api/run?path=hung")
    assert status == 200
    first, second = run["attempts"]
    assert (first["rank"], first["node"], first["ended_by"]) == ("1", "10.0.0.7", "hang")
    assert first["failures"][0]["error_type"] == "lumos.train.RankStuckError"
    assert [w["node_ip"] for w in first["workers"]] == ["10.0.0.6", "10.0.0.7"]
    assert second["restart"] == "new group"
    hang = first["hang"]
    assert hang["culprits"] == [
        {"rank": 1, "where": "train.py:9 in step", "why": "<b>x</b>", "node": "10.0.0.7"}
    ]
    assert hang["stacks_ranks"] == [0, 1]
    assert hang["stalled_s"] == 3.5
    assert second["hang"] is None
    assert [c["dir_name"] for c in run["checkpoints"]] == ["checkpoint_2"]
    deleted = run["deleted_checkpoints"]
    assert [(d["dir_name"], d["status"], d["kept"]) for d in deleted] == [
        ("checkpoint_0", "deleted", "deleted (retention)"),
        ("checkpoint_1", "deleted", "deleted (retention)"),
    ]


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("attempt=0&rank=1", 200),
        ("attempt=0&rank=5", 404),
        ("attempt=..&rank=1", 403),
        ("attempt=0&rank=%2e%2e%2fx", 403),
        ("attempt=-1&rank=0", 403),
        ("attempt=0", 403),
        ("attempt=%D9%A3&rank=0", 403),  # a non-ASCII digit
    ],
)
def test_stacks_endpoint_reads_only_a_hangs_rank_files(port: int, query: str, code: int) -> None:
    status, doc, _ = request(port, f"/api/stacks?path=hung&{query}")
    assert status == code, doc
    if code == 200:
        assert doc["text"].startswith("Thread main (rank 1)")
        assert doc["uri"].endswith("/_lumos/hangs/attempt-0/rank-1.txt")


def test_stacks_of_a_path_outside_the_root_are_refused(port: int) -> None:
    status, _, _ = request(port, "/api/stacks?path=..%2Fx&attempt=0&rank=0")
    assert status == 403


def test_a_restore_removes_an_index_record_a_killed_driver_left_half_written(
    tmp_path: Path,
) -> None:
    # the soak's driver_kill_in_final_write: SIGKILL after the state write, in the record's
    storage = RunStorage(str(tmp_path), "run-1")
    storage.save_state(RunState(name="run-1", status="finished"))
    folder = tmp_path / "_lumos" / "index" / "run-1"
    leftover = folder / ".00000000000000000001-abc.json.tmp-0123456789abcdef"
    leftover.write_bytes(b'{"v": 1, "na')
    RunStorage(str(tmp_path), "run-1").delete_uncommitted()
    assert not leftover.exists()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    assert len(list(folder.iterdir())) == 1  # the record itself is kept
