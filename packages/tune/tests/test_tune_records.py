"""Typed records: the trial journal, frozen trial snapshots, error records, the failure policy."""

from __future__ import annotations

import dataclasses
import logging
import pickle
from typing import Any

import fsspec
import pytest
from tune_helpers import make_controller

from lumos import tune
from lumos.tune._internal.errors import TrialErrorRecord
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import (
    EndRecord,
    ErrorRecord,
    ReportRecord,
    StartRecord,
    TrialJournal,
)
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.testing import Step, fail, report


def test_the_trial_journal_reads_back_what_it_wrote(tmp_path: Any) -> None:
    path = str(tmp_path / "trials.journal")
    journal = TrialJournal(FsJournal(fsspec.filesystem("file"), path))
    error = TrialErrorRecord("trial_00001", 0, "ValueError", "bad", "Traceback ...")
    records = [
        StartRecord(1, 0),
        ReportRecord(1, 1, {"loss": 0.5, "training_iteration": 1}, None),
        ReportRecord(1, 2, {"loss": 0.4, "training_iteration": 2}, "checkpoint_000002"),
        ErrorRecord(1, error),
        StartRecord(1, 1),
        EndRecord(1, TrialStatus.PRUNED),
    ]
    journal.extend(records)
    journal.close()
    again = TrialJournal(FsJournal(fsspec.filesystem("file"), path, writable=False))
    assert again.read() == records
    events = again.replay()[1]
    assert events.starts == 2
    assert [r.iteration for r in events.reports] == [1, 2]
    assert events.errors == [error]
    assert events.end == EndRecord(1, TrialStatus.PRUNED)
    # the on-disk format is unchanged (experiments written before still restore)
    with open(path) as f:
        first = f.readline()
    assert first.strip() == '{"e":"start","n":1,"a":0}'


def test_a_stored_error_record_is_not_the_exception_it_records() -> None:
    record = TrialErrorRecord("trial_00001", 2, "ValueError", "bad lr", "Traceback ...")
    assert not isinstance(record, BaseException)
    error = tune.TrialError.from_record(record)
    assert isinstance(error, tune.TuneError)
    assert error.record == record
    assert str(error).startswith("Trial 'trial_00001' (attempt 2) failed: ValueError: bad lr")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.attempt = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(record)) == record


def test_misuse_errors_are_tune_errors_and_builtins() -> None:
    assert issubclass(tune.TuneConfigError, tune.TuneError)
    assert issubclass(tune.TuneConfigError, ValueError)
    assert issubclass(tune.TuneTypeError, tune.TuneError)
    assert issubclass(tune.TuneTypeError, TypeError)
    assert issubclass(tune.SearchSpaceError, tune.TuneConfigError)
    grid = tune.ResultGrid([])
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        grid.get_best_result()
    with pytest.raises(tune.TuneConfigError, match="mode must be 'min' or 'max'"):
        grid.get_best_result(metric="loss", mode="best")


def test_callbacks_get_frozen_snapshots_not_the_live_trial(tmp_path: Any) -> None:
    seen: list[tune.Trial] = []

    class Meddler(tune.Callback):
        def on_trial_result(self, trial: tune.Trial, result: dict[str, Any]) -> None:
            seen.append(trial)
            with pytest.raises(dataclasses.FrozenInstanceError):
                trial.status = TrialStatus.ERROR  # type: ignore[misc]
            trial.last_result["loss"] = -1.0  # a copy: the sweep does not see it
            result["loss"] = -2.0

        def on_trial_complete(self, trial: tune.Trial) -> None:
            seen.append(trial)

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1)
    ctl, _ = make_controller(
        str(tmp_path), lambda s: [report({"loss": 1.0}), report({"loss": 0.5})], cfg
    )
    ctl.callbacks = [Meddler()]
    (live,) = ctl.run()
    assert isinstance(live, LiveTrial)
    assert live.last_result["loss"] == 0.5
    assert [r["loss"] for r in live.history] == [1.0, 0.5]
    assert ctl.study.trials[0].value == 0.5
    first, second, done = seen
    assert all(isinstance(t, tune.Trial) for t in seen)
    assert (first.iteration, len(first.history), first.status) == (1, 1, TrialStatus.RUNNING)
    assert (second.iteration, len(second.history)) == (2, 2)
    assert done.status is TrialStatus.TERMINATED
    assert [r["loss"] for r in done.history] == [1.0, 0.5]


def _fails_then_reports(spec: TrialSpec) -> list[Step]:
    if spec.attempt == 0:
        return [fail("flaky")]
    return [report({"loss": 1.0})]


def test_retries_follow_the_runtime_failure_policy_and_say_why(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1)
    ctl, ex = make_controller(str(tmp_path), _fails_then_reports, cfg, max_failures=2)
    with caplog.at_level(logging.INFO, logger="lumos.tune"):
        (trial,) = ctl.run()
    assert trial.status is TrialStatus.TERMINATED
    assert [s.attempt for s in ex.started] == [0, 1]
    assert "failure 1 of 2 allowed, retrying" in caplog.text
    assert "RuntimeError: flaky" in caplog.text


def test_fail_fast_text_carries_the_policys_reason(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1, fail_fast="raise")
    ctl, _ = make_controller(str(tmp_path), _fails_then_reports, cfg, max_failures=0)
    with pytest.raises(tune.TuneFailedError) as info:
        ctl.run()
    message = str(info.value)
    assert "exceeded FailureConfig(max_failures=0) after 1 failure(s)" in message
    assert "FailureConfig(fail_fast='raise')" in message
    assert [type(e) for e in info.value.errors] == [tune.TrialError]
