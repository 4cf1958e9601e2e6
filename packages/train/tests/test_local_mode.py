"""Local mode (``ScalingConfig(num_workers=0)``): in this process, without Ray; and torchrun.

The in-process tests never start Ray (``ray.is_initialized()`` stays False); the torchrun
test starts ``python -m torch.distributed.run --nproc-per-node=2`` (gloo on loopback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import local_example
import pytest

from lumos import train
from lumos.storage import RunStorage

HERE = Path(__file__).resolve().parent


def _state(storage: Path, name: str) -> Any:
    state = RunStorage(str(storage), name).load_state()
    assert state is not None
    return state


def test_readme_example_runs_in_this_process_without_ray(tmp_path: Path) -> None:
    import ray

    was_up = ray.is_initialized()  # another test of this session may have started Ray
    result = local_example.fit(str(tmp_path), "demo", epochs=4)

    assert ray.is_initialized() == was_up
    assert result.metrics["epoch"] == 3
    assert result.metrics["world"] == 1
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("epoch=3")
    # retention as in a Ray run: num_to_keep=2 (the latest is always kept)
    assert sorted(Path(c.path).name for c, _ in result.best_checkpoints) == ["epoch=2", "epoch=3"]
    assert sorted(p.name for p in (tmp_path / "demo").iterdir() if p.name.startswith("epoch")) == [
        "epoch=2",
        "epoch=3",
    ]
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    state = _state(tmp_path, "demo")
    assert state.status == "finished"
    assert [a.status for a in state.attempts] == ["finished"]
    with result.checkpoint.as_directory() as d:
        # the data loader's position travels with the checkpoint, as on Ray
        assert sorted(os.listdir(d)) == [".lumos_data_positions", "rank0.json", "state.pt"]
    # a finished run returns its stored result without training again
    again = local_example.fit(str(tmp_path), "demo", epochs=4)
    assert again.checkpoint is not None
    assert again.checkpoint.path == result.checkpoint.path
    # in a fresh process: no Ray at all
    code = (
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import local_example, ray; "
        f"local_example.fit({str(tmp_path)!r}, 'fresh', epochs=2); print(ray.is_initialized())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"


def _context_and_checkpoints(config: dict[str, Any]) -> None:
    ctx = train.get_context()
    seen = {
        "rank": ctx.get_world_rank(),
        "size": ctx.get_world_size(),
        "local": ctx.get_local_rank(),
        "node": ctx.get_node_rank(),
        "name": ctx.get_run_name(),
        "attempt": ctx.get_attempt(),
        "start": train.get_checkpoint().path if train.get_checkpoint() else None,
    }
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = int(Path(d, "i").read_text()) + 1
    for i in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "i").write_text(str(i))
            mode = train.CheckpointUploadMode.ASYNC if i % 2 else train.CheckpointUploadMode.SYNC
            train.report(
                {"i": i},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"i={i}",
                checkpoint_upload_mode=mode,
                delete_local_checkpoint_after_upload=False,
            )
        train.report({"i": i, "metrics_only": True})
        if i == config.get("crash_at"):
            raise ValueError(f"crash at {i}")
    reported = train.get_all_reported_checkpoints()
    seen["reported"] = [Path(r.checkpoint.path).name for r in reported]
    latest = train.get_checkpoint()
    seen["latest"] = Path(latest.path).name if latest else None
    config["seen"].append(seen)


def test_context_sync_and_async_checkpoints_and_restore(tmp_path: Path) -> None:
    import ray

    was_up = ray.is_initialized()  # another test of this session may have started Ray
    seen: list[dict[str, Any]] = []

    def fit(crash_at: int | None) -> train.Result:
        return train.DataParallelTrainer(
            _context_and_checkpoints,
            train_loop_config={"steps": 4, "crash_at": crash_at, "seen": seen},
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=train.RunConfig(name="ctx", storage_path=str(tmp_path), verbose=0),
        ).fit()

    # the user's own exception reaches the caller as it is (debuggers stop at it)
    with pytest.raises(ValueError, match="crash at 2"):
        fit(crash_at=2)
    state = _state(tmp_path, "ctx")
    assert state.status == "errored"
    assert [c.dir_name for c in state.checkpoints] == ["i=0", "i=1", "i=2"]

    result = fit(crash_at=None)  # job-level restore: resumes from the latest commit
    assert ray.is_initialized() == was_up
    assert len(seen) == 1
    assert seen[0] | {"start": Path(seen[0]["start"]).name} == {
        "rank": 0,
        "size": 1,
        "local": 0,
        "node": 0,
        "name": "ctx",
        "attempt": 1,
        "start": "i=2",
        "reported": ["i=0", "i=1", "i=2", "i=3"],
        "latest": "i=3",
    }
    assert result.metrics == {"i": 3, "metrics_only": True}
    # the history: the first attempt's reports up to the commit it resumes from (i=2),
    # then the resumed ones
    frame = result.metrics_dataframe
    assert list(frame["i"]) == [0, 0, 1, 1, 2, 3, 3]
    state = _state(tmp_path, "ctx")
    assert [a.status for a in state.attempts] == ["errored", "finished"]


def _reuses_a_name() -> None:
    for _ in range(2):
        with tempfile.TemporaryDirectory() as d:
            train.report({}, checkpoint=train.Checkpoint.from_directory(d), checkpoint_dir_name="x")


def test_report_errors_surface_in_the_training_function(tmp_path: Path) -> None:
    with pytest.raises(train.CheckpointReportError, match="already used"):
        train.DataParallelTrainer(
            _reuses_a_name,
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=train.RunConfig(name="dup", storage_path=str(tmp_path), verbose=0),
        ).fit()
    assert _state(tmp_path, "dup").status == "errored"


def _torchrun(tmp_path: Path, *args: str, script: str = "local_example.py") -> Any:
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(HERE / script), str(tmp_path), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def test_torchrun_two_ranks_commit_on_rank0_and_rerun_resumes(tmp_path: Path) -> None:
    """torchrun --nproc-per-node=2 runs the same script: one rank per process.

    The first run crashes at epoch 2 (rank 1 raises; torchrun stops rank 0); running
    the same command again resumes from the latest committed checkpoint.
    """
    marker = tmp_path / "crashed"
    first = _torchrun(tmp_path, "tr", str(marker))
    assert first.returncode != 0, first.stderr[-5000:]
    assert marker.exists(), first.stderr[-5000:]
    state = _state(tmp_path, "tr")
    assert [c.dir_name for c in state.checkpoints] == ["epoch=0", "epoch=1"]

    second = _torchrun(tmp_path, "tr", str(marker))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
    assert "resuming run 'tr'" in second.stderr
    assert "checkpoint 'epoch=1'" in second.stderr
    results = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert r["metrics"]["epoch"] == 3
        assert r["metrics"]["world"] == 2
        assert r["checkpoint"].endswith("epoch=3")
        assert not r["dist_initialized"]  # the group lumos joined is left again
    assert results[0]["best"] == results[1]["best"]
    # both ranks' shards are in the committed checkpoint
    assert sorted(os.listdir(tmp_path / "tr" / "epoch=3")) == [
        ".lumos_data_positions",
        "rank0.json",
        "rank1.json",
        "state.pt",
    ]
    state = _state(tmp_path, "tr")
    assert state.status == "finished"
    assert [c.dir_name for c in state.checkpoints] == ["epoch=2", "epoch=3"]
    assert len(state.attempts) == 2
    assert state.attempts[-1].status == "finished"


def test_torchrun_ranks_validate_and_roll_back_together(tmp_path: Path) -> None:
    """Under torchrun, rank 0's run core validates and checks; every rank follows it."""
    run = _torchrun(tmp_path, "th", script="torchrun_health.py")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "fired on report #4" in run.stderr
    results = [json.loads((tmp_path / f"health-rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]
    assert results[0]["metrics"]["step"] == 5
    state = _state(tmp_path, "th")
    assert [a.status for a in state.attempts] == ["rolled_back", "finished"]
    assert state.rollbacks[0].to_checkpoint == "step=3"
    assert [c.validation_status for c in state.checkpoints] == ["validated"] * 6
    assert sorted(os.listdir(tmp_path / "th" / "step=5")) == [
        "shard_0.txt",
        "shard_1.txt",
        "state.json",
    ]
    starts = [r["start"] for r in map(json.loads, open(tmp_path / "log.jsonl")) if "start" in r]
    assert starts == [0, 4]
