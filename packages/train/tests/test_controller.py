"""The controller state machine, driven through fit() with the runtime's fake worker group.

No Ray here: ``lumos.runtime.testing.FakeCluster`` hands out in-process groups whose
workers are threads with real WorkerSessions; failures are scripted.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import train_fns
from conftest import run_config
from fake_runs import Recorder, make, states

from lumos import train
from lumos.runtime import FailureKind, WorkerGroupProtocol, WorkerGroupStartError
from lumos.runtime.testing import FakeCluster, FakeWorkerGroup
from lumos.storage import RunStorage
from lumos.train._internal.backend import Backend


def test_success_commits_every_checkpoint_and_keeps_history(tmp_path: Path) -> None:
    cluster = FakeCluster()
    rec = Recorder()
    trainer = make(train_fns.checkpointing_loop, {"steps": 4}, tmp_path, cluster, callbacks=[rec])
    result = trainer.fit()
    assert states(trainer) == ["scheduling", "running", "finished"]
    assert result.metrics["step"] == 3
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/run/checkpoint_3")
    assert [m["step"] for _, m in result.best_checkpoints] == [0, 1, 2, 3]
    assert [row["step"] for row in result.metrics_history] == [0, 1, 2, 3]
    # every rank's files are in the checkpoint (sharded save), and every rank got its commit notice
    with result.checkpoint.as_directory() as d:
        assert sorted(p.name for p in Path(d).iterdir()) == [
            "shard_0.txt",
            "shard_1.txt",
            "state.json",
        ]
    group = cluster.groups[0]
    assert [v for v, ranks in group.sent if ranks == [0, 1]] == [
        ("commit", i, f"checkpoint_{i}") for i in range(4)
    ]
    assert group.closed
    assert [c for c in rec.calls if c[0] == "report"][-1][1][1] == result.checkpoint
    assert rec.calls[-1] == ("finish", (True, None))
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.status == "finished"
    assert [a.status for a in state.attempts] == ["finished"]


def test_metrics_only_reports_are_all_kept_in_order(tmp_path: Path) -> None:
    trainer = make(train_fns.metrics_only_loop, {"n": 700}, tmp_path, FakeCluster())
    result = trainer.fit()
    history = result.metrics_history
    assert [row["i"] for row in history] == list(range(700))
    assert {row["rank"] for row in history} == {0}
    assert result.checkpoint is None
    assert len(result.metrics_dataframe) == 700


def test_user_error_without_retries_raises_with_the_workers_error(tmp_path: Path) -> None:
    rec = Recorder()
    trainer = make(train_fns.failing_loop, {"rank": 1}, tmp_path, FakeCluster(), callbacks=[rec])
    with pytest.raises(train.TrainingFailedError) as info:
        trainer.fit()
    err = info.value
    assert "FailureConfig(max_failures=0)" in str(err)
    assert set(err.worker_errors) == {1}
    assert "bad batch on purpose" in str(err.worker_errors[1])
    assert states(trainer)[-2:] == ["restarting", "errored"]
    assert ("failure", ([(1, FailureKind.USER_ERROR)], False)) in rec.calls
    assert rec.calls[-1] == ("finish", (False, "WorkerGroupError"))  # a TrainingFailedError
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert state.status == "errored"


def test_worker_death_replaces_only_that_worker_and_resumes_from_the_latest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = FakeCluster([lambda g: g.after_reports(5, lambda g: g.kill_worker(1))])
    rec = Recorder()
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 6},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=1),
        callbacks=[rec],
        verbose=True,
    )
    result = trainer.fit()
    err = capsys.readouterr().err
    assert "replaced rank 1 in " in err
    assert "(a new worker process for rank 1)" in err  # the fake group has no standby
    assert result.metrics["step"] == 5
    assert result.metrics["attempt"] == 1
    assert result.metrics["start"] >= 1  # resumed from a checkpoint, not from scratch
    assert len(cluster.groups) == 1  # the survivors kept their "processes"
    assert cluster.groups[0].replaced == [[1]]
    assert states(trainer) == [
        "scheduling",
        "running",
        "restarting",
        "scheduling",
        "running",
        "finished",
    ]
    failure = next(c for c in rec.calls if c[0] == "failure")
    assert failure[1] == ([(1, FailureKind.ACTOR_DIED)], True)
    restart = next(c for c in rec.calls if c[0] == "restart")
    assert restart[1][0] == 1
    assert restart[1][1] is not None
    # the history continues from the resumed checkpoint: one row per step
    assert [row["step"] for row in result.metrics_history] == list(range(6))


def test_hung_worker_is_replaced(tmp_path: Path) -> None:
    cluster = FakeCluster([lambda g: g.after_reports(3, lambda g: g.hang_worker(0))])
    rec = Recorder()
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 4},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=1),
        callbacks=[rec],
    )
    assert trainer.fit().metrics["step"] == 3
    assert cluster.groups[0].replaced == [[0]]
    assert next(c for c in rec.calls if c[0] == "failure")[1][0] == [(0, FailureKind.HUNG)]


def test_full_group_strategy_starts_a_new_group(tmp_path: Path) -> None:
    cluster = FakeCluster([lambda g: g.after_reports(3, lambda g: g.kill_worker(0))])
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 4},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=1, restart_strategy="full_group"),
    )
    assert trainer.fit().metrics["step"] == 3
    assert len(cluster.groups) == 2
    assert cluster.groups[0].closed
    assert cluster.groups[0].replaced == []


def test_restart_budget_exhausted_names_the_setting(tmp_path: Path) -> None:
    def script(g: FakeWorkerGroup) -> None:
        g.after_reports(3, lambda g: g.kill_worker(1))
        g.after_reports(9, lambda g: g.kill_worker(0))

    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 50},
        tmp_path,
        FakeCluster([script]),
        failure_config=train.FailureConfig(max_failures=1),
    )
    with pytest.raises(train.TrainingFailedError, match=r"FailureConfig\(max_failures=1\)") as info:
        trainer.fit()
    assert set(info.value.worker_errors) == {0}
    assert states(trainer).count("restarting") == 2


def test_failure_while_restarting_counts_as_a_failure(tmp_path: Path) -> None:
    cluster = FakeCluster(
        [
            lambda g: g.after_reports(3, lambda g: g.kill_worker(0)),
            WorkerGroupStartError("no resources for 2 workers"),
            None,
        ]
    )
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 4},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=2, restart_strategy="full_group"),
    )
    assert trainer.fit().metrics["step"] == 3
    assert len(cluster.specs) == 3

    cluster = FakeCluster(
        [lambda g: g.after_reports(3, lambda g: g.kill_worker(0)), WorkerGroupStartError("nope")]
    )
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 4},
        tmp_path,
        cluster,
        name="run2",
        failure_config=train.FailureConfig(max_failures=1, restart_strategy="full_group"),
    )
    with pytest.raises(train.TrainingFailedError, match=r"could not start the workers.*nope"):
        trainer.fit()


def test_different_checkpoint_dir_names_across_ranks_fail_clearly(tmp_path: Path) -> None:
    trainer = make(
        train_fns.mismatched_dir_names,
        {},
        tmp_path,
        FakeCluster(),
        failure_config=train.FailureConfig(max_failures=3),
    )
    with pytest.raises(train.TrainingFailedError) as info:
        trainer.fit()
    text = str(info.value)
    assert "different checkpoint_dir_name" in text
    assert "rank 0: 'ckpt_rank0'" in text
    assert "rank 1: 'ckpt_rank1'" in text
    assert states(trainer).count("restarting") == 0  # not retried: it would fail again


def test_retention_keeps_best_n_by_score_plus_latest(tmp_path: Path) -> None:
    losses = [5.0, 1.0, 4.0, 0.5, 3.0, 6.0]
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 6, "losses": losses},
        tmp_path,
        FakeCluster(),
        checkpoint_config=train.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        ),
    )
    result = trainer.fit()
    kept = sorted(Path(c.path).name for c, _ in result.best_checkpoints)
    assert kept == ["checkpoint_1", "checkpoint_3", "checkpoint_5"]
    on_disk = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name != "_lumos")
    assert on_disk == kept


def test_callback_exception_stops_the_run(tmp_path: Path) -> None:
    class Boom(train.Callback):
        def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
            raise RuntimeError("callback broke")

    cluster = FakeCluster()
    trainer = make(train_fns.stopping_loop, {}, tmp_path, cluster, callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="callback broke"):
        trainer.fit()
    assert cluster.groups[0].closed


def test_a_checkpoint_that_a_finished_rank_never_reported_fails_clearly(tmp_path: Path) -> None:
    # both orders of "rank 1 returned" and "rank 0 reported" are unit-tested in
    # test_report_aggregator.py; here rank 0 reports after rank 1 returned
    config = {"key": f"{tmp_path}:uneven"}
    train_fns.EVENTS[config["key"]] = threading.Event()
    trainer = make(train_fns.uneven_checkpoints, config, tmp_path, FakeCluster())
    with pytest.raises(train.TrainingFailedError, match=r"rank\(s\) \[1\] returned without"):
        trainer.fit()


@pytest.mark.parametrize("verbose", [True, False])
def test_waiting_for_resources_reaches_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verbose: bool
) -> None:
    # ISSUE6 F2: the runtime's on_waiting line is printed as a Train state line
    line = "waiting for resources: 0 of 2 worker(s) started; free in the cluster now: CPU=0"
    cluster = FakeCluster(waiting_messages=[line])
    make(train_fns.metrics_only_loop, {"n": 1}, tmp_path, cluster, verbose=verbose).fit()
    err = capsys.readouterr().err
    if verbose:
        assert f"[lumos.train] {line}\n" in err
        assert err.index(line) < err.index("started 2 worker(s)")
    else:
        assert line not in err


class _BrokenBackend(Backend):
    def prepare_launch(self, group: WorkerGroupProtocol) -> None:
        raise OSError("no free port")


class _BrokenBackendTrainer(train.DataParallelTrainer):
    def _backend(self) -> Backend:
        return _BrokenBackend()


def test_a_backend_setup_failure_says_so_and_counts_as_a_start_failure(tmp_path: Path) -> None:
    rec = Recorder()
    trainer = _BrokenBackendTrainer(
        train_fns.metrics_only_loop,
        train_loop_config={"n": 1},
        run_config=run_config(tmp_path, callbacks=[rec]),
        _group_factory=FakeCluster().start,
    )
    with pytest.raises(
        train.TrainingFailedError,
        match=r"could not set up the training backend on the workers: OSError: no free port",
    ):
        trainer.fit()
    assert ("failure", ([(-1, FailureKind.START_FAILED)], False)) in rec.calls


def test_a_permanent_storage_error_fails_the_run_clearly_and_keeps_its_commits(
    tmp_path: Path,
) -> None:
    from fsspec.implementations.local import LocalFileSystem

    from lumos.storage import StorageIOError
    from lumos.storage.testing import FaultyFileSystem

    faulty = FaultyFileSystem(LocalFileSystem(), enabled=False)

    class BreakStorage(train.Callback):
        """Once checkpoint 1 is committed, every write to the run's storage fails."""

        def on_report(self, metrics: dict[str, Any], checkpoint: train.Checkpoint | None) -> None:
            if metrics["step"] == 1:
                faulty.set_faults(enabled=True, permanent=True, write_failure_rate=1.0)

    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 5},
        tmp_path,
        FakeCluster(),
        callbacks=[BreakStorage()],
        storage_filesystem=faulty,
    )
    with pytest.raises(train.TrainingFailedError, match="storage failed") as info:
        trainer.fit()
    assert states(trainer)[-1] == "errored"
    errors = list(info.value.worker_errors.values())
    assert any(isinstance(e, StorageIOError) for e in errors), errors
    # what was committed before the fault is still there, complete and named by the state
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert [c.dir_name for c in state.checkpoints][:2] == ["checkpoint_0", "checkpoint_1"]
    for c in state.checkpoints:
        assert sorted(p.name for p in (tmp_path / "run" / c.dir_name).iterdir()) == [
            "shard_0.txt",
            "shard_1.txt",
            "state.json",
        ]
