"""What keeps a 10,000-trial sweep's driver lean: O(1) ``ask()``, flat memory, O(1) files.

Speed and RSS themselves are measured by ``benchmarks/bench_tune.py``; these tests
check the behaviours those numbers rest on.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import optuna
from optuna.trial import TrialState

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.tune._internal.journal import FsJournal, StudyJournalBackend, StudyStorage


def _storage(path: str) -> tuple[StudyStorage, StudyJournalBackend]:
    backend = StudyJournalBackend(FsJournal(fsspec.filesystem("file"), path))
    return StudyStorage(backend), backend


def test_enqueued_trials_come_out_first_in_order_and_survive_a_reopen(tmp_path: Any) -> None:
    path = str(tmp_path / "study.journal")
    storage, backend = _storage(path)
    study = optuna.create_study(study_name="s", storage=storage)
    for x in (1.0, 2.0, 3.0):
        study.enqueue_trial({"x": x})
    first = study.ask()
    assert first.suggest_float("x", 0, 10) == 1.0
    study.tell(first, 1.0)
    backend.journal.flush()

    # A new driver (restore): the two still-waiting trials are found and keep their order.
    reopened, _ = _storage(path)
    study2 = optuna.load_study(study_name="s", storage=reopened)
    xs = []
    for _ in range(3):
        t = study2.ask()
        xs.append(t.suggest_float("x", 0, 10))
        study2.tell(t, 0.0)
    assert xs[:2] == [2.0, 3.0]
    assert 0.0 <= xs[2] <= 10.0
    study_id = reopened.get_study_id_from_name("s")
    assert reopened.get_all_trials(study_id, states=(TrialState.WAITING,)) == []
    # Any other query still goes through Optuna's own scan.
    assert len(reopened.get_all_trials(study_id, states=(TrialState.COMPLETE,))) == 4


def test_the_study_backend_drops_what_the_storage_has_read(tmp_path: Any) -> None:
    storage, backend = _storage(str(tmp_path / "study.journal"))
    study = optuna.create_study(study_name="s", storage=storage)
    for _ in range(200):
        t = study.ask()
        study.tell(t, t.suggest_float("x", 0, 1))
    assert len(study.trials) == 200
    assert backend.held <= 2  # not one log per ask/suggest/tell for the whole sweep
    backend.journal.flush()
    # ...while the file keeps everything: a new reader sees all 200 trials.
    reread, _ = _storage(str(tmp_path / "study.journal"))
    assert len(optuna.load_study(study_name="s", storage=reread).trials) == 200


def _objective(config: dict[str, Any]) -> None:
    tune.report({"loss": config["x"]})


def _files_after(tmp_path: Any, name: str, n: int) -> int:
    grid = tune.Tuner(
        _objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=n,
            sampler=optuna.samplers.RandomSampler(seed=0),
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
        _pool_factory=lambda resources: FakeWorkerPool(resources),
    ).fit()
    assert grid.num_terminated == n
    return sum(len(files) + len(dirs) for _, dirs, files in os.walk(tmp_path / name))


def test_a_sweep_without_checkpoints_or_loggers_writes_o1_files(tmp_path: Any) -> None:
    assert _files_after(tmp_path, "small", 5) == _files_after(tmp_path, "large", 60)
