"""Attempt records carry who failed where and how the next attempt started (no Ray).

Driven through ``fit()`` with the runtime's ``FakeCluster`` (in-process groups whose
workers are threads with real sessions), plus the pure helpers of ``attempt_log``.
"""

from __future__ import annotations

from pathlib import Path

import train_fns
from fake_runs import make

from lumos import train
from lumos.runtime import FailureKind, RemoteError, WorkerFailure, WorkerInfo
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunState, RunStorage
from lumos.train._internal.controller import attempt_log
from lumos.train._internal.errors import RankStuckError


def _state(tmp_path: Path) -> RunState:
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    return state


def test_a_dead_worker_is_recorded_with_rank_node_and_kind_and_its_replacement(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster([lambda g: g.after_reports(5, lambda g: g.kill_worker(1))])
    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 6},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=1),
    )
    trainer.fit()
    first, second = _state(tmp_path).attempts
    assert first.ended_by == "failure"
    assert first.restart == "first launch"
    [failure] = first.failures
    assert (failure.rank, failure.kind, failure.preempted) == (1, "actor_died", False)
    worker = cluster.groups[0].workers[1]
    assert (failure.node_id, failure.node_ip) == (worker.node_id, worker.node_ip)
    assert failure.message.startswith("worker process died")
    assert [w.rank for w in first.workers] == [0, 1]
    assert first.workers[1].node_ip == worker.node_ip
    # the fake group has no standby: a new process took rank 1 in the same group
    assert second.restart == "replaced rank 1 by a new process"
    assert second.failures == []
    assert second.ended_by is None


def test_a_user_error_records_the_error_type_and_a_new_group_restart(tmp_path: Path) -> None:
    cluster = FakeCluster()
    trainer = make(
        train_fns.failing_loop,
        {"rank": 1},
        tmp_path,
        cluster,
        failure_config=train.FailureConfig(max_failures=1),
    )
    try:
        trainer.fit()
    except train.TrainingFailedError:
        pass
    attempts = _state(tmp_path).attempts
    assert len(attempts) == 2
    [failure] = attempts[0].failures
    assert failure.rank == 1
    assert failure.kind == "user_error"
    assert failure.error_type is not None
    assert failure.error_type.endswith("ValueError")
    assert attempts[1].restart in ("new group", "same workers")  # a user error keeps processes


def _worker(rank: int) -> WorkerInfo:
    return WorkerInfo(rank, 2, rank, 2, 0, f"node{rank:02d}" * 4, f"10.0.0.{rank + 1}", 100 + rank)


def test_failure_records_name_the_node_ip_pid_and_a_hangs_stacks_folder() -> None:
    stuck = RankStuckError(
        "rank 1 stuck", 1, "n1", "train.py:3 in step", "not in a collective", (1,),
        "s3://bucket/runs/run/_lumos/hangs/attempt-0",
    )  # fmt: skip
    failures = [
        WorkerFailure(1, FailureKind.HUNG, None, RemoteError("x.RankStuckError", "m", "", cause=stuck), "stuck"),
        WorkerFailure(-1, FailureKind.START_FAILED, None, None, "no placement"),
    ]  # fmt: skip
    hung, group = attempt_log.failure_records(failures, [_worker(0), _worker(1)])
    assert (hung.rank, hung.kind, hung.node_ip, hung.pid) == (1, "hung", "10.0.0.2", 101)
    assert hung.stacks == "hangs/attempt-0"
    assert hung.error_type == "x.RankStuckError"
    assert (group.rank, group.node_ip, group.stacks) == (-1, None, None)
    assert attempt_log.ended_by(failures, preempted=False) == "hang"
    assert attempt_log.ended_by(failures[1:], preempted=True) == "preemption"
    assert attempt_log.ended_by(failures[1:], preempted=False) == "failure"


def test_restart_text_says_how_an_attempt_started() -> None:
    def text(attempt: int, **kw: object) -> str:
        args: dict[str, object] = {"first_launch": False, "after": None, "kept_group": False}
        args.update(kw)
        replaced = args.pop("replaced", [])
        return attempt_log.restart_text(attempt, replaced=replaced, **args)  # type: ignore[arg-type]

    rep = attempt_log.Replacement
    assert text(0, first_launch=True) == "first launch"
    assert text(3, first_launch=True) == "resumed by a new fit(), new group"
    assert text(1) == "new group"
    assert text(1, kept_group=True) == "same workers"
    assert text(1, kept_group=True, replaced=[rep((1,), (1,))]) == "replaced rank 1 by standby"
    both = [rep((0, 2), (2,))]
    assert text(1, kept_group=True, replaced=both) == (
        "replaced rank 2 by standby; rank 0 by a new process"
    )
    assert text(2, after="rollback", kept_group=True) == "rollback, same workers"
    assert text(2, after="resize") == "resize, new group"


def test_old_attempt_records_without_the_new_fields_still_load(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "old")
    storage.fs.makedirs(storage.state_dir, exist_ok=True)
    Path(storage.state_path).write_text(
        '{"schema_version": 1, "name": "old", "status": "errored", "attempts": '
        '[{"index": 0, "status": "errored", "error": "boom"}]}'
    )
    state = storage.load_state()
    assert state is not None
    [attempt] = state.attempts
    assert (attempt.failures, attempt.workers, attempt.restart, attempt.ended_by) == (
        [],
        [],
        None,
        None,
    )
    assert state.deleted_checkpoints == []
