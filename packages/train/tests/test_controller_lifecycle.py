"""A run's life around the state machine: parent job (Tune trial), restore, lease, cleanup.

No Ray here: the runs use ``lumos.runtime.testing.FakeCluster``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import train_fns
from fake_runs import make, states, trial_context

from lumos import train
from lumos.runtime.context import running
from lumos.runtime.testing import FakeCluster
from lumos.storage import LeaseHeldError, RunStorage


def test_job_context_storage_reports_and_parent_exception(tmp_path: Path) -> None:
    seen: list[int] = []

    class Pruned(Exception):
        pass

    def report(metrics: dict[str, Any]) -> None:
        seen.append(metrics["i"])
        if len(seen) == 5:
            raise Pruned()

    cluster = FakeCluster()
    trainer = train.DataParallelTrainer(
        train_fns.stopping_loop,
        train_loop_config={},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
        _group_factory=cluster.start,
    )
    with running(trial_context(tmp_path, report, threading.Event())), pytest.raises(Pruned):
        trainer.fit()
    assert seen == [0, 1, 2, 3, 4]
    assert cluster.groups[0].closed
    assert not cluster.groups[0].leaked_threads
    state = RunStorage(tmp_path / "trial_0", "train").load_state()
    assert state is not None
    assert state.status == "aborted"


def test_job_context_stop_event_stops_workers_and_raises_stop_error(tmp_path: Path) -> None:
    stop = threading.Event()

    def report(metrics: dict[str, Any]) -> None:
        if metrics["i"] == 3:
            stop.set()

    cluster = FakeCluster()
    trainer = train.DataParallelTrainer(
        train_fns.stopping_loop,
        train_loop_config={},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
        _group_factory=cluster.start,
    )
    with running(trial_context(tmp_path, report, stop)), pytest.raises(KeyError, match="pruned"):
        trainer.fit()
    assert states(trainer)[-1] == "aborted"
    assert cluster.groups[0].closed
    assert not cluster.groups[0].leaked_threads


def test_job_level_restore_resumes_then_returns_the_finished_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"steps": 5, "die": {"rank": 1, "step": 3, "how": "raise"}}
    cluster = FakeCluster()
    with pytest.raises(train.TrainingFailedError):
        make(train_fns.checkpointing_loop, config, tmp_path, cluster).fit()
    # same RunConfig(storage_path, name): resumes from checkpoint_2 (attempt 1 does not fail)
    trainer = make(train_fns.checkpointing_loop, config, tmp_path, cluster, verbose=True)
    result = trainer.fit()
    assert result.metrics == {"step": 4, "start": 3, "attempt": 1}
    assert (
        "resuming run 'run' (it was errored) from checkpoint 'checkpoint_2'"
        in capsys.readouterr().err
    )
    # a finished run is not trained again
    groups = len(cluster.groups)
    again = make(train_fns.checkpointing_loop, config, tmp_path, cluster, verbose=True).fit()
    assert len(cluster.groups) == groups
    assert again.metrics == result.metrics
    assert again.checkpoint == result.checkpoint
    assert "already finished" in capsys.readouterr().err
    assert train.Result.from_path(str(tmp_path / "run")).metrics["step"] == 4


def test_a_second_live_driver_is_refused(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "run")
    with storage.acquire_lease():
        with pytest.raises(LeaseHeldError):
            make(train_fns.metrics_only_loop, {"n": 1}, tmp_path, FakeCluster()).fit()


def test_uncommitted_leftovers_are_removed_on_restore(tmp_path: Path) -> None:
    trainer = make(train_fns.checkpointing_loop, {"steps": 2}, tmp_path, FakeCluster())
    storage = RunStorage(tmp_path, "run")
    from lumos.storage import RunState

    storage.save_state(RunState(name="run", status="aborted"))
    (tmp_path / "run" / "checkpoint_9").mkdir()
    (tmp_path / "run" / "checkpoint_9" / "half.bin").write_bytes(b"x")
    trainer.fit()
    assert not (tmp_path / "run" / "checkpoint_9").exists()


def test_ctrl_c_aborts_and_the_next_fit_resumes(tmp_path: Path) -> None:
    class Interrupt(train.Callback):
        def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
            if metrics["step"] == 2 and checkpoint is not None:
                raise KeyboardInterrupt

    cluster = FakeCluster()
    config = {"steps": 5}
    with pytest.raises(KeyboardInterrupt):
        make(train_fns.checkpointing_loop, config, tmp_path, cluster, callbacks=[Interrupt()]).fit()
    assert cluster.groups[0].closed
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.status == "aborted"
    result = make(train_fns.checkpointing_loop, config, tmp_path, cluster).fit()
    assert result.metrics["step"] == 4
    assert result.metrics["start"] == 3


@pytest.mark.parametrize("then", ["raise", "stop"])
def test_an_ended_run_removes_its_uncommitted_upload_and_keeps_committed_ones(
    tmp_path: Path, then: str
) -> None:
    # ISSUE6 F1: a failed or pruned run (never resumed) must not leave checkpoint_2 behind
    config = {"key": f"{tmp_path}:{then}", "then": then}
    uploaded = train_fns.EVENTS[config["key"] + ":uploaded"] = threading.Event()
    stop = train_fns.EVENTS[config["key"] + ":stop"] = threading.Event()
    cluster = FakeCluster()
    trainer = train.DataParallelTrainer(
        train_fns.upload_then_end,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
        _group_factory=cluster.start,
    )
    expected: type[BaseException] = train.TrainingFailedError if then == "raise" else KeyError
    with running(trial_context(tmp_path, lambda m: None, stop)), pytest.raises(expected):
        trainer.fit()
    assert cluster.groups[0].closed
    assert uploaded.is_set()
    storage = RunStorage(tmp_path / "trial_0", "train")
    state = storage.load_state()
    assert state is not None
    assert state.status == ("errored" if then == "raise" else "aborted")
    assert storage.list_uncommitted() == []
    assert state.checkpoint_names() == ["checkpoint_0", "checkpoint_1"]
    on_disk = sorted(p.name for p in Path(storage.run_path).iterdir() if p.name != "_lumos")
    assert on_disk == ["checkpoint_0", "checkpoint_1"]


def test_a_storage_error_while_removing_leftovers_does_not_hide_the_runs_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(self: RunStorage, reserved: Any = ()) -> list[str]:
        raise OSError("storage unreachable")

    monkeypatch.setattr(RunStorage, "delete_uncommitted", broken)
    config = {"key": str(tmp_path), "then": "raise"}
    train_fns.EVENTS[config["key"] + ":uploaded"] = threading.Event()
    trainer = make(train_fns.upload_then_end, config, tmp_path, FakeCluster(), verbose=True)
    with pytest.raises(train.TrainingFailedError, match="rank 1 fails"):
        trainer.fit()
    assert "cleanup step failed: OSError: storage unreachable" in capsys.readouterr().err
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.status == "errored"
