"""The experiment on storage: journals, the study in Optuna's journal format, restore."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from tune_helpers import make_controller

from lumos import tune
from lumos.storage import CheckpointRecord, RunState, RunStorage
from lumos.tune._internal.experiment import (
    _delete_uncommitted_checkpoints,
    open_experiment,
    study_journal_path,
)
from lumos.tune._internal.journal import FsJournal, StudyJournalBackend
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import EndRecord, ReportRecord, StartRecord
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.testing import ScriptedExecutor, Step, report


class Crash(BaseException):
    """Stands in for the driver being killed."""


class CrashingExecutor(ScriptedExecutor):
    def __init__(self, script: Any, crash_after_polls: int) -> None:
        super().__init__(script)
        self.crash_after = crash_after_polls

    def poll(self, timeout_s: float | None) -> list[Any]:
        if self.polls >= self.crash_after:
            raise Crash()
        return super().poll(timeout_s)


def script(spec: TrialSpec) -> list[Step]:
    x = spec.config["x"]
    steps = 2 if spec.trial_id in ("00000", "00001") else 6
    return [
        report({"loss": x + i}, checkpoint=(i == 1)) for i in range(spec.start_iteration, steps)
    ]


CFG = tune.TuneConfig(
    metric="loss", mode="min", num_samples=4, sampler=optuna.samplers.RandomSampler(seed=1)
)
SPACE = {"x": tune.uniform(0, 1), "const": "c"}


def _commit_checkpoint(storage_path: str, trial_name: str, iteration: int) -> None:
    # What the trial's actor does with tune.report(..., checkpoint=...).
    trial_storage = RunStorage(storage_path, "exp").child(trial_name)
    trial_storage.fs.makedirs(
        trial_storage.checkpoint_path(f"checkpoint_{iteration:06d}"), exist_ok=True
    )
    trial_storage.commit_checkpoint(
        RunState(name=trial_name),
        CheckpointRecord(dir_name=f"checkpoint_{iteration:06d}", report_index=iteration),
    )


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_restore_keeps_finished_trials_and_resumes_unfinished_ones(
    tmp_path: Any, backend: str
) -> None:
    storage_path = str(tmp_path) if backend == "local" else f"memory://tune-{uuid.uuid4().hex}"
    ex = CrashingExecutor(script, crash_after_polls=4)
    ctl, _ = make_controller(storage_path, script, CFG, SPACE, executor=ex)
    with pytest.raises(Crash):
        ctl.run()
    before = {t.trial_name: t for t in ctl.trials}
    assert before["trial_00000"].status is TrialStatus.TERMINATED
    assert before["trial_00002"].status is TrialStatus.RUNNING
    _commit_checkpoint(storage_path, "trial_00002", 1)
    # an unfinished upload of the crashed attempt is cleaned up on restore
    trial2 = RunStorage(storage_path, "exp").child("trial_00002")
    trial2.fs.makedirs(trial2.checkpoint_path("checkpoint_000003"), exist_ok=True)
    trial2.fs.makedirs(trial2.checkpoint_path("nested-train-run"), exist_ok=True)

    exp = open_experiment(RunStorage(storage_path, "exp"), SearchSpace(SPACE), CFG)
    assert exp.resumed
    restored = {t.trial_name: t for t in exp.trials}
    assert restored["trial_00000"].status is TrialStatus.TERMINATED
    assert restored["trial_00000"].last_result == before["trial_00000"].last_result
    assert restored["trial_00000"].config == before["trial_00000"].config
    assert restored["trial_00002"].status is TrialStatus.PENDING
    assert restored["trial_00002"].checkpoint_dir == "checkpoint_000001"
    assert restored["trial_00002"].checkpoint_iteration == 1
    assert [r["training_iteration"] for r in restored["trial_00002"].history] == [1]
    leftovers = sorted(trial2.list_uncommitted())
    assert leftovers == ["nested-train-run"]
    exp.close()

    ctl2, ex2 = make_controller(storage_path, script, CFG, SPACE)
    trials = ctl2.run()
    assert len(trials) == 4
    relaunched = [s.trial_id for s in ex2.started]
    assert "00000" not in relaunched
    assert "00001" not in relaunched
    resumed = next(s for s in ex2.started if s.trial_id == "00002")
    assert (resumed.checkpoint_dir, resumed.start_iteration) == ("checkpoint_000001", 1)
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    t2 = next(t for t in trials if t.trial_id == "00002")
    assert [r["training_iteration"] for r in t2.history] == [1, 2, 3, 4, 5, 6]
    study = ctl2.study
    assert len(study.trials) == 4
    assert all(t.state is TrialState.COMPLETE for t in study.trials)


def test_study_journal_opens_with_optunas_own_file_backend(tmp_path: Any) -> None:
    ctl, _ = make_controller(str(tmp_path), script, CFG, SPACE)
    trials = ctl.run()
    ctl.exp.close()
    path = study_journal_path(RunStorage(str(tmp_path), "exp"))
    assert os.path.isfile(path)  # `optuna-dashboard <path>` opens this file as it is
    study = optuna.load_study(study_name="exp", storage=JournalStorage(JournalFileBackend(path)))
    assert [t.value for t in study.trials] == [pytest.approx(t.last_result["loss"]) for t in trials]
    assert study.metric_names == ["loss"]


def test_export_and_load_study_from_object_storage() -> None:
    storage_path = f"memory://tune-{uuid.uuid4().hex}"
    ctl, _ = make_controller(storage_path, script, CFG, SPACE)
    ctl.run()
    ctl.exp.close()
    study = tune.load_study(storage_path, "exp")
    assert len(study.trials) == 4
    fs = fsspec.filesystem("memory")
    chunks = fs.ls(f"{storage_path[len('memory://') :]}/exp/_lumos/study.journal.d", detail=False)
    assert chunks  # object stores get immutable chunks, not appends


def test_export_study_journal_writes_one_local_file(tmp_path: Any) -> None:
    storage_path = f"memory://tune-{uuid.uuid4().hex}"
    ctl, _ = make_controller(storage_path, script, CFG, SPACE)
    ctl.run()
    ctl.exp.close()
    out = tune.export_study_journal(storage_path, "exp", str(tmp_path / "study.journal"))
    study = optuna.load_study(study_name="exp", storage=JournalStorage(JournalFileBackend(out)))
    assert len(study.trials) == 4


def test_torn_last_line_is_dropped_before_appending(tmp_path: Any) -> None:
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "j.journal")
    j = FsJournal(fs, path)
    j.append([{"a": 1}, {"a": 2}])
    j.flush()
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"a": 3')  # the driver died mid-write
    j2 = FsJournal(fs, path)
    assert j2.read() == [{"a": 1}, {"a": 2}]
    j2.append([{"a": 4}])
    j2.close()
    assert [json.loads(line) for line in open(path)] == [{"a": 1}, {"a": 2}, {"a": 4}]


def test_journal_buffers_until_flush(tmp_path: Any) -> None:
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "j.journal")
    j = FsJournal(fs, path)
    j.append([{"a": 1}])
    assert j.pending == 1
    assert not os.path.exists(path)
    assert j.flush()
    assert not j.flush()  # nothing new
    assert FsJournal(fs, path).read() == [{"a": 1}]
    j.close()


def test_study_backend_replays_its_own_logs(tmp_path: Any) -> None:
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "s.journal")
    backend = StudyJournalBackend(FsJournal(fs, path))
    study = optuna.create_study(study_name="s", storage=JournalStorage(backend))
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    study.tell(trial, 1.0)
    backend.journal.close()
    again = optuna.load_study(
        study_name="s", storage=JournalStorage(StudyJournalBackend(FsJournal(fs, path)))
    )
    assert again.trials[0].value == 1.0


def test_restore_with_other_directions_is_refused(tmp_path: Any) -> None:
    ctl, _ = make_controller(str(tmp_path), script, CFG, SPACE)
    ctl.run()
    ctl.exp.close()
    other = tune.TuneConfig(metric="loss", mode="max", num_samples=4)
    with pytest.raises(tune.TuneError, match="directions"):
        open_experiment(RunStorage(str(tmp_path), "exp"), SearchSpace(SPACE), other)


def test_restore_tells_the_study_about_trials_that_ended_before_the_crash(tmp_path: Any) -> None:
    # The trial journal says trial 0 ended, but the study never heard (crash between writes).
    ctl, _ = make_controller(str(tmp_path), script, CFG, SPACE)
    storage = RunStorage(str(tmp_path), "exp")
    exp = ctl.exp
    ot = exp.study.ask()
    config = SearchSpace(SPACE).sample(ot)
    exp.trials_journal.append(
        StartRecord(0, 0),
        ReportRecord(0, 1, {"loss": 0.3, "training_iteration": 1}, None),
        EndRecord(0, TrialStatus.TERMINATED),
    )
    exp.close()
    again = open_experiment(storage, SearchSpace(SPACE), CFG)
    assert again.trials[0].status is TrialStatus.TERMINATED
    assert again.trials[0].config == config
    assert again.study.trials[0].state is TrialState.COMPLETE
    assert again.study.trials[0].value == 0.3


def test_optuna_dashboard_opens_the_stored_study_as_it_is(tmp_path: Any) -> None:
    dashboard = pytest.importorskip("optuna_dashboard")
    from wsgiref.util import setup_testing_defaults

    from optuna_dashboard._storage_url import guess_storage_from_url

    ctl, _ = make_controller(str(tmp_path), script, CFG, SPACE)
    trials = ctl.run()
    ctl.exp.close()
    path = study_journal_path(RunStorage(str(tmp_path), "exp"))
    # what `optuna-dashboard <path>` does with its argument, then its HTTP API
    app = dashboard.wsgi(guess_storage_from_url(path))

    def get(url: str) -> Any:
        env: dict[str, Any] = {}
        setup_testing_defaults(env)
        env["PATH_INFO"] = url
        status: list[str] = []
        body = b"".join(app(env, lambda s, h, e=None: status.append(s)))
        assert status == ["200 OK"], (status, body[:500])
        return json.loads(body)

    (summary,) = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == "exp"
    detail = get(f"/api/studies/{summary['study_id']}")
    assert len(detail["trials"]) == len(trials)


def test_readers_never_cut_a_journal_a_live_driver_is_writing(tmp_path: Any) -> None:
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "j.journal")
    with open(path, "wb") as f:
        f.write(b'{"a": 1}\n{"a": 2')  # the writer is in the middle of a line
    assert FsJournal(fs, path, writable=False).read() == [{"a": 1}]
    assert open(path, "rb").read() == b'{"a": 1}\n{"a": 2'  # untouched
    reader = FsJournal(fs, path, writable=False)
    reader.append([{"a": 3}])
    with pytest.raises(RuntimeError, match="read-only"):
        reader.flush()


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_cleanup_never_deletes_a_nested_run_whatever_its_name(tmp_path: Any, backend: str) -> None:
    storage_path = str(tmp_path) if backend == "local" else f"memory://tune-{uuid.uuid4().hex}"
    _commit_checkpoint(storage_path, "trial_00000", 1)
    trial = RunStorage(storage_path, "exp").child("trial_00000")
    trial.fs.makedirs(trial.checkpoint_path("checkpoint_000003"), exist_ok=True)  # stale upload
    trial.fs.makedirs(trial.checkpoint_path("artifacts"), exist_ok=True)  # user files
    # Train runs nested in the trial: the default name and one the user chose.
    for name in ("train", "checkpoint_finetune"):
        nested = trial.child(name)
        nested.save_state(RunState(name=name))
        nested.fs.makedirs(nested.checkpoint_path("checkpoint_000000"), exist_ok=True)

    assert _delete_uncommitted_checkpoints(trial) == ["checkpoint_000003"]
    assert trial.list_uncommitted() == ["artifacts", "checkpoint_finetune", "train"]
    for name in ("train", "checkpoint_finetune"):
        nested = trial.child(name)
        state = nested.load_state()
        assert state is not None
        assert state.name == name
        assert nested.fs.isdir(nested.checkpoint_path("checkpoint_000000"))
