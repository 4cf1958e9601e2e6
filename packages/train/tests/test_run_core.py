"""RunCore alone: the bookkeeping both backends drive (no Ray, no worker group, no thread).

Reports go in as ``RankReport``s, notices to the ranks come out of a list, and the run
state is read back from storage after each step. A recording component on the seam
checks the hooks' order.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lumos import train
from lumos.runtime import FailureAction, FailureDecision, FailureKind, WorkerFailure
from lumos.storage import CheckpointConfig, RunState, RunStorage
from lumos.train._internal.console import Console
from lumos.train._internal.controller.core import RunCore
from lumos.train._internal.controller.run_book import RunBook
from lumos.train._internal.controller.seam import (
    Attempt,
    CommitDraft,
    Committed,
    Component,
    RollbackRequest,
    RunBroken,
    Validated,
)
from lumos.train._internal.controller.spec import RunSpec
from lumos.train._internal.controller.validations import ThreadValidationLauncher
from lumos.train._internal.data_positions import POSITIONS_FILE
from lumos.train._internal.wire import RankReport


class Seen(Component):
    """Records each hook with what the stored state names at that moment."""

    def __init__(self, storage: RunStorage) -> None:
        self.storage = storage
        self.calls: list[tuple[str, Any]] = []

    def _named(self) -> list[str]:
        state = self.storage.load_state()
        return state.checkpoint_names() if state is not None else []

    def attempt_started(self, attempt: Attempt) -> None:
        self.calls.append(("attempt", (attempt.index, attempt.base)))

    def before_commit(self, draft: CommitDraft) -> None:
        self.calls.append(("before", (draft.commit.dir_name, self._named())))

    def report_committed(self, committed: Committed) -> None:
        self.calls.append(("committed", (committed.commit.dir_name, self._named())))

    def validation_finished(self, validated: Validated) -> None:  # type: ignore[override]
        self.calls.append(("validated", validated.outcome.dir_name))

    def rolled_back(self, dir_names: set[str]) -> None:
        self.calls.append(("rolled_back", sorted(dir_names)))

    def worker_failed(self, failures: Any, will_retry: bool) -> None:
        self.calls.append(("failed", will_retry))

    def run_ending(self, finished: bool) -> None:
        self.calls.append(("ending", finished))


class Calls(train.Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
        self.calls.append(("report", (metrics.get("step"), checkpoint is not None)))

    def on_finish(self, result: Any, error: BaseException | None) -> None:
        self.calls.append(("finish", type(error).__name__ if error else None))


def _core(
    tmp_path: Path,
    *,
    notify: Any = None,
    retention: Any = None,
    resume: bool = False,
    **run: Any,
) -> tuple[RunCore, Seen, Calls]:
    storage = RunStorage(str(tmp_path), "run")
    state = storage.load_state() if resume else None
    if state is None:
        state = RunState(name="run")
        storage.save_state(state)
    calls = Calls()
    spec = RunSpec(
        train_fn=lambda: None,
        config=None,
        pass_config=False,
        storage=storage,
        worker_storage=(str(tmp_path), None),
        retention=retention,
        callbacks=(calls,),
        console=Console(0),
        **run,
    )
    seen = Seen(storage)
    return RunCore(spec, state, notify or (lambda m: None), extra=(seen,)), seen, calls


def _report(core: RunCore, index: int, dir_name: str | None = None, **kw: Any) -> Any:
    """Rank 0's report ``index`` (its checkpoint's files written first, as a rank does)."""
    if dir_name is not None:
        os.makedirs(core.run.storage.checkpoint_path(dir_name), exist_ok=True)
    metrics = {"step": index, "loss": kw.pop("loss", 1.0 / (index + 1))}
    return core.on_report(0, RankReport(index, metrics, dir_name, **kw))


def _stored(core: RunCore) -> RunState:
    state = core.run.storage.load_state()
    assert state is not None
    return state


def test_one_commit_order_state_then_notice_then_deletes(tmp_path: Path) -> None:
    notices: list[tuple[Any, bool]] = []
    c0 = tmp_path / "run" / "c0"

    def notify(message: Any) -> None:  # what a rank learns, and whether c0 is still there
        notices.append((message, c0.exists()))

    keep_one = CheckpointConfig(num_to_keep=1).retention()
    core, seen, calls = _core(tmp_path, notify=notify, retention=keep_one)
    core.start()
    args = core.begin_attempt(0, 1, None)
    assert (args.attempt, args.report_index_base, args.checkpoint_dir_name) == (0, 0, None)
    assert _report(core, 0, "c0") is None
    assert _report(core, 1) is None  # metrics only: straight to the callbacks
    assert _report(core, 2, "c2") is None
    # before_commit: the state does not name it yet; report_committed: it does
    assert [c for c in seen.calls if c[0] in ("before", "committed")] == [
        ("before", ("c0", [])),
        ("committed", ("c0", ["c0"])),
        ("before", ("c2", ["c0"])),
        ("committed", ("c2", ["c2"])),  # retention dropped c0 from the state ...
    ]
    # ... and deleted its directory only after the ranks were told of c2
    assert notices == [(("commit", 0, "c0"), True), (("commit", 2, "c2"), True)]
    assert not c0.exists()
    assert calls.calls == [("report", (0, True)), ("report", (1, False)), ("report", (2, True))]
    assert _stored(core).checkpoint_names() == ["c2"]


def test_loader_positions_are_in_the_checkpoint_before_the_state_names_it(tmp_path: Path) -> None:
    core, _, _ = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0", data_positions=b"where")
    assert (Path(core.run.storage.checkpoint_path("c0")) / POSITIONS_FILE).exists()


def test_misuse_is_a_verdict_not_an_exception(tmp_path: Path) -> None:
    core, _, _ = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 2, None)
    assert core.on_report(1, RankReport(0, {}, "a")) is None
    verdict = core.on_report(0, RankReport(0, {}, "b"))
    assert isinstance(verdict, RunBroken)
    assert "different checkpoint_dir_name" in str(verdict.error)
    assert "different checkpoint_dir_name" in str(core.broken_error(verdict))


def test_a_firing_check_stops_the_report_before_it_commits_and_rolls_back(
    tmp_path: Path,
) -> None:
    core, seen, calls = _core(tmp_path, health_checks=(train.NonFiniteMetric("loss"),))
    core.start()
    core.begin_attempt(0, 1, None)
    for i in range(3):
        assert _report(core, i, f"c{i}") is None
    verdict = _report(core, 3, "c3", loss=math.nan)
    assert isinstance(verdict, RollbackRequest)
    assert _stored(core).checkpoint_names() == ["c0", "c1", "c2"]  # the bad one never commits
    assert ("report", (3, True)) not in calls.calls  # nor reaches a callback
    plan = core.health.plan(verdict.fired)
    assert plan.error is None
    assert plan.target is not None
    assert plan.target.dir_name == "c2"
    core.end_attempt("rolled_back", plan.why)
    assert core.roll_back(plan) == plan.target
    args = core.begin_attempt(1, 1, plan.target)
    assert args.report_index_base == 3
    assert args.rollback is not None
    assert (args.rollback.from_report, args.rollback.to_checkpoint) == (3, "c2")
    state = _stored(core)
    assert [a.status for a in state.attempts] == ["rolled_back", "running"]
    assert state.rollbacks[0].check == "NonFiniteMetric('loss')"
    assert ("rolled_back", []) in seen.calls


def test_a_named_target_renames_the_later_checkpoints_and_a_bad_one_is_an_error(
    tmp_path: Path,
) -> None:
    def back_to_c1(report: train.HealthReport, history: Any) -> train.Rollback | None:
        return train.Rollback("bad", to_checkpoint="c1") if report.index == 4 else None

    core, seen, _ = _core(tmp_path, health_checks=(back_to_c1,), max_rollbacks=1)
    core.start()
    core.begin_attempt(0, 1, None)
    for i in range(4):
        _report(core, i, f"c{i}")
    verdict = _report(core, 4)
    assert isinstance(verdict, RollbackRequest)
    plan = core.health.plan(verdict.fired)
    core.roll_back(plan)
    assert ("rolled_back", ["c2", "c3"]) in seen.calls
    state = _stored(core)
    assert [r.dir_name for r in state.checkpoints if r.rolled_back] == [
        "c2.rolled-back-1",
        "c3.rolled-back-1",
    ]
    # max_rollbacks=1 is used up: the next plan is an error that names the setting
    again = core.health.plan(verdict.fired)
    assert again.error is not None
    assert "max_rollbacks=1" in str(again.error)


def _validate(checkpoint: train.Checkpoint, scale: float = 1.0) -> dict[str, Any]:
    return {"val": scale}


def test_a_validation_is_requested_at_commit_and_stored_when_it_ends(tmp_path: Path) -> None:
    notices: list[Any] = []
    core, seen, _ = _core(
        tmp_path,
        notify=notices.append,
        validation_config=train.ValidationConfig(_validate),
        validation_launcher=lambda c: ThreadValidationLauncher(c.fn),
    )
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0", validation={"fn_kwargs": {"scale": 2.0}})
    record = _stored(core).checkpoints[0]
    assert record.validation_status == "pending"
    assert record.validation_request == {"fn_kwargs": {"scale": 2.0}, "timeout_s": None}
    assert core.outstanding() == 1
    deadline = time.monotonic() + 30
    while core.outstanding() and time.monotonic() < deadline:
        assert core.idle(0.5) is None
    record = _stored(core).checkpoints[0]
    assert (record.validation_status, record.metrics["val"]) == ("validated", 2.0)
    assert notices[-1] == ("validated", 0, "validated")
    assert ("validated", "c0") in seen.calls
    result = core.close(core.finish())
    assert result.metrics["step"] == 0


class _Killed(BaseException):
    """The driver's SIGKILL, at one storage write."""


@pytest.mark.parametrize("killed_at", ["merge_metrics", "update_checkpoints"])
def test_a_driver_killed_while_it_records_a_validation_leaves_it_pending_or_in_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed_at: str
) -> None:
    # A validated checkpoint's metrics are in its history row: the state says
    # "validated" only after the history has them, so a rerun either validates again
    # (pending) or reads them (CI once saw a rerun's history row 3 without val_loss).
    storage = RunStorage(str(tmp_path), "run")
    book = RunBook(storage, RunState(name="run"))
    storage.append_metrics([{"step": 0}], 0)
    os.makedirs(storage.checkpoint_path("c0"))
    book.commit(0, "c0", {"step": 0}, validation_request={"fn_kwargs": {}})

    def killed(*args: Any, **kwargs: Any) -> None:
        raise _Killed

    monkeypatch.setattr(storage, killed_at, killed)
    with pytest.raises(_Killed):
        book.record_validation("c0", "validated", {"val": 2.0}, None)
    again = RunStorage(str(tmp_path), "run")
    record = again.load_state().checkpoints[0]  # type: ignore[union-attr]
    row = again.read_metrics()[record.report_index]
    assert record.validation_status == "pending" or row.get("val") == 2.0, (record, row)


def test_a_resumed_run_without_a_validation_config_fails_its_pending_validations(
    tmp_path: Path,
) -> None:
    core, _, _ = _core(
        tmp_path,
        validation_config=train.ValidationConfig(_validate),
        validation_launcher=lambda c: ThreadValidationLauncher(c.fn),
    )
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0", validation={})
    core.close_failed(KeyboardInterrupt(), aborted=True, clean=True)  # stays pending
    assert _stored(core).checkpoints[0].validation_status == "pending"
    again, _, _ = _core(tmp_path, resume=True)  # no validation_config now
    again.start()
    record = _stored(again).checkpoints[0]
    assert record.validation_status == "failed"
    assert "no validation_config" in (record.validation_error or "")


def test_finish_records_the_attempt_and_the_run_then_run_ending(tmp_path: Path) -> None:
    core, seen, calls = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0")
    assert core.on_rank_ended(0, returned=True) is None
    assert not core.attempt.running
    result = core.close(core.finish())
    assert result.checkpoint is not None
    state = _stored(core)
    assert (state.status, [a.status for a in state.attempts]) == ("finished", ["finished"])
    assert seen.calls[-1] == ("ending", True)
    assert calls.calls[-1] == ("finish", None)


def test_a_finished_runs_state_does_not_say_whether_validations_outlived_its_ranks(
    tmp_path: Path,
) -> None:
    """The training-finished mark is for a resumed driver (only validations were left);
    the finished run's record is the same whether the last validation ended before or
    after the ranks did (a timing the two backends and any two runs differ in)."""
    core, _, _ = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0")
    assert core.on_rank_ended(0, returned=True) is None
    core.training_finished(1)  # the ranks returned with a validation still running
    assert _stored(core).extra == {"training_finished": True}
    core.book.mark_training_finished(False)  # a rollback: training goes on, as never marked
    assert _stored(core).extra == {}
    core.training_finished(1)
    core.close(core.finish())
    state = _stored(core)
    assert (state.status, state.extra) == ("finished", {})


def test_a_failed_attempt_is_recorded_and_the_components_learn_of_it(tmp_path: Path) -> None:
    core, seen, _ = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 1, None)
    failure = WorkerFailure(0, FailureKind.ACTOR_DIED, message="worker process died")
    core.attempt_failed([failure], FailureDecision(FailureAction.RETRY, "retrying"))
    assert ("failed", True) in seen.calls
    state = _stored(core)
    assert (state.attempts[0].status, state.attempts[0].error) == ("errored", "worker process died")


@pytest.mark.parametrize(
    ("error", "aborted", "status"),
    [(KeyboardInterrupt(), True, "aborted"), (ValueError("boom"), False, "errored")],
)
def test_the_failure_path_cleans_up_and_keeps_the_runs_own_error(
    tmp_path: Path, error: BaseException, aborted: bool, status: str
) -> None:
    core, seen, calls = _core(tmp_path)
    core.start()
    core.begin_attempt(0, 1, None)
    _report(core, 0, "c0")
    os.makedirs(core.run.storage.checkpoint_path("c1"))  # an upload that never committed
    assert core.close_failed(error, aborted=aborted, clean=True) is error
    state = _stored(core)
    assert state.status == status
    assert state.attempts[0].status == status
    assert state.attempts[0].error == f"{type(error).__name__}: {error}"
    assert core.run.storage.list_uncommitted() == []
    assert state.checkpoint_names() == ["c0"]
    assert seen.calls[-1] == ("ending", False)
    assert calls.calls[-1] == ("finish", type(error).__name__)


def test_a_parent_jobs_stop_is_returned_not_raised(tmp_path: Path) -> None:
    import threading

    from lumos.runtime.context import JobContext

    stop = threading.Event()
    ctx = JobContext(
        kind="tune.trial",
        name="t",
        storage_path=str(tmp_path),
        storage_filesystem=None,
        report=lambda m: None,
        stop_event=stop,
        stop_error=lambda: KeyError("pruned"),
    )
    core, _, _ = _core(tmp_path, job_context=ctx)
    assert core.parent_stop() is None
    stop.set()
    assert isinstance(core.parent_stop(), KeyError)
    assert core.stopped_from_outside(ValueError("any"))
