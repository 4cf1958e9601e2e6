"""Ray-compatible reporting, fine-tuning starts and ASYNC uploads on a real local Ray cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import report_fns
from conftest import run_config

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_ray_docs_pattern_on_two_ranks(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = TorchTrainer(
        report_fns.ray_docs_pattern,
        train_loop_config={"epochs": 3, "out": str(out), "mode": mode},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "docs"),
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/docs/epoch=2")
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "docs" / "epoch=2").iterdir()) == ["model.json"]
    if mode == "SYNC":  # rank 0 waited for its last commit
        assert json.loads((out / "latest_rank0.json").read_text()) == 2


def test_two_ranks_raising_apart_are_both_in_worker_errors(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError) as info:
        train.DataParallelTrainer(
            report_fns.raise_apart,
            train_loop_config={"marker": str(tmp_path / "rank0-raised")},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, "apart"),
        ).fit()
    errors = info.value.worker_errors
    assert set(errors) == {0, 1}
    assert "rank 0 fails first" in str(errors[0])
    assert "rank 1 fails second" in str(errors[1])


def test_a_tensor_in_metrics_is_refused_with_the_item_hint(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError) as info:
        TorchTrainer(
            report_fns.tensor_metrics,
            train_loop_config={},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, "tensor"),
        ).fit()
    # Both ranks report the tensor, but the rank that fails first can tear down the
    # process group while its peer still connects: that peer then fails in gloo.
    texts = [str(e) for e in info.value.worker_errors.values()]
    assert any("metrics['loss']" in t and ".item()" in t for t in texts), texts


def test_resume_from_checkpoint_then_sigkill_resumes_from_the_runs_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pre = tmp_path / "pretrained"
    pre.mkdir()
    (pre / "model.json").write_text(json.dumps({"step": -1, "rank": 0}))
    result = TorchTrainer(
        report_fns.fine_tune,
        train_loop_config={"steps": 4, "die_at": 2, "out": str(out)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "finetune", failure_config=train.FailureConfig(max_failures=1)
        ),
        resume_from_checkpoint=train.Checkpoint.from_directory(str(pre)),
    ).fit()
    assert json.loads((out / "attempt0_rank1.json").read_text())["step"] == -1
    again = json.loads((out / "attempt1_rank1.json").read_text())
    assert again["step"] == 1
    assert again["path"].endswith("/finetune/checkpoint_1")
    assert result.metrics == {"step": 3, "first": 2}


def test_async_rank_sigkilled_mid_upload_resumes_from_the_last_commit(tmp_path: Path) -> None:
    result = TorchTrainer(
        report_fns.slow_upload_then_die,
        train_loop_config={"epochs": 4, "never": str(tmp_path / "never-created")},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "midupload", failure_config=train.FailureConfig(max_failures=1)
        ),
    ).fit()
    # epoch=1 never committed (rank 1 died uploading it): the restart began after epoch=0
    assert result.metrics == {"epoch": 3, "start": 1}
    run = tmp_path / "midupload"
    assert not list(run.glob("epoch=1/half_rank1.bin"))  # the half upload was removed
    state = RunStorage(tmp_path, "midupload").load_state()
    assert state is not None
    assert state.checkpoint_names() == ["epoch=0", "epoch=1", "epoch=2", "epoch=3"]
    assert [a.status for a in state.attempts] == ["errored", "finished"]
