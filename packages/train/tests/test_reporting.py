"""Ray-compatible reporting, fine-tuning starts and upload modes on the fake worker group.

No Ray: ``FakeCluster`` runs the ranks as threads with real sessions and real storage.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import inproc_fns
import pytest
import report_fns
from fake_runs import make

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage
from lumos.train._internal.metrics_check import check_metrics
from lumos.train._internal.uploader import MAX_UPLOADS_IN_FLIGHT


def _key(*events: str) -> str:
    key = uuid.uuid4().hex
    for e in events:
        inproc_fns.EVENTS[f"{key}:{e}"] = threading.Event()
    return key


def _dirs(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir())


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_ray_docs_pattern_only_rank0_passes_a_checkpoint(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    cfg = {"epochs": 3, "mode": mode, "out": str(out)}
    result = make(report_fns.ray_docs_pattern, cfg, tmp_path, FakeCluster()).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/run/epoch=2")
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]
    assert _dirs(tmp_path / "run") == ["_lumos", "epoch=0", "epoch=1", "epoch=2"]
    assert sorted(p.name for p in (tmp_path / "run" / "epoch=1").iterdir()) == ["model.json"]
    if mode == "SYNC":  # rank 0 waited for its last commit
        assert json.loads((out / "latest_rank0.json").read_text()) == 2


def test_every_failed_ranks_error_is_in_worker_errors(tmp_path: Path) -> None:
    cfg = {"marker": str(tmp_path / "rank0-raised")}
    with pytest.raises(train.TrainingFailedError) as info:
        make(report_fns.raise_apart, cfg, tmp_path, FakeCluster()).fit()
    errors = info.value.worker_errors
    assert set(errors) == {0, 1}
    assert "rank 0 fails first" in str(errors[0])
    assert "rank 1 fails second" in str(errors[1])


def test_a_reused_name_is_refused_before_any_file_is_written(tmp_path: Path) -> None:
    key = _key()
    with pytest.raises(train.TrainingFailedError) as info:
        make(report_fns.reuse_name, {"key": key}, tmp_path, FakeCluster()).fit()
    # the first rank to refuse fails the run; the other may be stopped before it reports
    errors = info.value.worker_errors
    assert errors
    assert all("already used by a committed checkpoint" in str(e) for e in errors.values())
    recorded = [v for k, v in report_fns.FACTS.items() if k.startswith(key)]
    assert recorded
    assert all("checkpoint names must be unique in a run" in v for v in recorded)
    # the committed checkpoint is unchanged: no file of the refused report reached it
    best = tmp_path / "run" / "best"
    assert sorted(p.name for p in best.iterdir()) == ["model.json"]
    assert json.loads((best / "model.json").read_text())["step"] == 1
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.checkpoint_names() == ["best"]


def test_metrics_check_names_the_key() -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    check_metrics({"a": 1, "b": np.float32(0.5), "c": [1, {"d": np.int64(2)}], "e": None})
    with pytest.raises(train.TrainTypeError, match=r"metrics\['loss'\].*\.item\(\)"):
        check_metrics({"ok": 1, "loss": torch.tensor(0.5)})
    with pytest.raises(train.TrainTypeError, match=r"metrics\['w'\].*torch.Tensor"):
        check_metrics({"w": [torch.zeros(2)]})
    with pytest.raises(TypeError, match=r"metrics\['obj'\].*cannot be stored as JSON"):
        check_metrics({"obj": object()})


def test_a_tensor_in_metrics_fails_the_run_with_the_hint(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError) as info:
        make(report_fns.tensor_metrics, {}, tmp_path, FakeCluster()).fit()
    assert ".item()" in str(info.value.worker_errors[0])


def _starting_checkpoint(tmp_path: Path) -> train.Checkpoint:
    d = tmp_path / "pretrained"
    d.mkdir()
    (d / "model.json").write_text(json.dumps({"step": -1, "rank": 0}))
    return train.Checkpoint.from_directory(str(d))


def test_resume_from_checkpoint_then_a_failure_resumes_from_the_runs_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    start = _starting_checkpoint(tmp_path)
    trainer = train.DataParallelTrainer(
        report_fns.fine_tune,
        train_loop_config={"steps": 4, "die_at": 2, "how": "raise", "out": str(out)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="run",
            storage_path=str(tmp_path),
            verbose=False,
            failure_config=train.FailureConfig(max_failures=1),
        ),
        resume_from_checkpoint=start,
        _group_factory=FakeCluster().start,
    )
    result = trainer.fit()
    first = json.loads((out / "attempt0_rank0.json").read_text())
    assert first == {"step": -1, "path": start.path}
    again = json.loads((out / "attempt1_rank1.json").read_text())
    assert again["step"] == 1  # the run's own checkpoint_1, not the starting one
    assert again["path"].endswith("/run/checkpoint_1")
    assert result.metrics == {"step": 3, "first": 2}


def test_job_level_restore_ignores_the_starting_checkpoint_once_the_run_committed(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    start = _starting_checkpoint(tmp_path)

    def trainer() -> train.DataParallelTrainer:
        return train.DataParallelTrainer(
            report_fns.fine_tune,
            train_loop_config={"steps": 4, "die_at": 2, "how": "raise", "out": str(out)},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=train.RunConfig(name="run", storage_path=str(tmp_path), verbose=False),
            resume_from_checkpoint=start,
            _group_factory=FakeCluster().start,
        )

    with pytest.raises(train.TrainingFailedError):
        trainer().fit()  # commits checkpoint_0 and checkpoint_1, then rank 1 fails
    result = trainer().fit()  # the same run again: job-level restore
    again = json.loads((out / "attempt1_rank0.json").read_text())
    assert again["step"] == 1
    assert again["path"].endswith("/run/checkpoint_1")
    assert result.metrics == {"step": 3, "first": 2}


def test_resume_from_checkpoint_must_be_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(train.TrainConfigError, match="resume_from_checkpoint='/x'"):
        train.DataParallelTrainer(
            report_fns.fine_tune, train_loop_config={}, resume_from_checkpoint="/x"
        )  # type: ignore[arg-type]


def test_async_retention_never_deletes_a_checkpoint_still_uploading(tmp_path: Path) -> None:
    key = _key("release", "uploaded")
    trainer = make(
        inproc_fns.async_retention,
        {"key": key},
        tmp_path,
        FakeCluster(),
        workers=1,
        checkpoint_config=train.CheckpointConfig(num_to_keep=1),
    )
    result = trainer.fit()
    # when epoch=1 committed (retention dropped epoch=0), epoch=2 was uploading: kept
    assert report_fns.FACTS[key + ":dirs"] == ["_lumos", "epoch=1", "epoch=2"]
    assert report_fns.FACTS[key + ":all"] == [("epoch=2", 2, "COMMITTED")]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("epoch=2")
    assert _dirs(tmp_path / "run") == ["_lumos", "epoch=2"]


def test_back_pressure_bounds_the_uploads_in_flight(tmp_path: Path) -> None:
    key = _key()
    make(report_fns.back_pressure, {"key": key, "n": 5}, tmp_path, FakeCluster(), workers=1).fit()
    at_finish = report_fns.FACTS[key]
    assert len(at_finish) == 5
    # when upload i finished, at most MAX reports after it had returned
    assert all(n <= i + MAX_UPLOADS_IN_FLIGHT for i, n in enumerate(at_finish)), at_finish


def test_no_upload_registers_what_is_already_in_the_run(tmp_path: Path) -> None:
    result = make(report_fns.no_upload, {}, tmp_path, FakeCluster()).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/run/dcp_1")
    assert sorted(p.name for p in (tmp_path / "run" / "dcp_1").iterdir()) == [
        "shard_0.json",
        "shard_1.json",
    ]


def test_no_upload_of_a_checkpoint_outside_the_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError) as info:
        make(report_fns.no_upload, {"wrong": True}, tmp_path, FakeCluster()).fit()
    text = str(info.value)
    assert "checkpoint_upload_mode=NO_UPLOAD" in text
    assert "<run>/<checkpoint_dir_name>" in text


def test_checkpoint_upload_fn_in_sync_and_async(tmp_path: Path) -> None:
    result = make(report_fns.upload_fn_modes, {}, tmp_path, FakeCluster()).fit()
    for name in ("fn_sync", "fn_async"):
        files = sorted(p.name for p in (tmp_path / "run" / name).iterdir())
        assert files == ["model.json", "uploaded_by_0.txt", "uploaded_by_1.txt"]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("fn_async")


def test_checkpoint_upload_fn_must_return_the_runs_directory(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError, match="checkpoint_upload_fn"):
        make(report_fns.upload_fn_modes, {"wrong": True}, tmp_path, FakeCluster()).fit()


def test_async_from_a_temporary_directory_uploads_the_snapshot(tmp_path: Path) -> None:
    key = _key()
    result = make(
        report_fns.async_temporary_directory, {"key": key, "steps": 3}, tmp_path, FakeCluster()
    ).fit()
    names = [(f"checkpoint_{i}", i) for i in range(3)]
    assert report_fns.FACTS[key] == names
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert json.loads((Path(d) / "model.json").read_text())["step"] == 2


def test_an_upload_error_fails_that_rank_and_the_run_restarts(tmp_path: Path) -> None:
    # a file sits where rank 0's ASYNC upload of epoch=1 must create a directory
    run = tmp_path / "run"
    run.mkdir()
    (run / "epoch=1").write_text("in the way")
    trainer = make(
        report_fns.ray_docs_pattern,
        {"epochs": 3, "mode": "ASYNC"},
        tmp_path,
        FakeCluster(),
        failure_config=train.FailureConfig(max_failures=1),
    )
    with pytest.raises(train.TrainingFailedError) as info:
        trainer.fit()
    assert set(info.value.worker_errors) == {0}
    assert "epoch=1" in str(info.value.worker_errors[0])
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["errored", "errored"]  # it restarted once
    assert "checkpoint upload failed" in (state.attempts[0].error or "")
    assert state.checkpoint_names() == ["epoch=0"]
