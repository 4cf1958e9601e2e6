"""What keeps a 10,000-trial sweep's driver lean: O(1) ``ask()``, flat memory, O(1) files.

Speed and RSS themselves are measured by ``benchmarks/bench_tune.py``; these tests
check the behaviours those numbers rest on.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from typing import Any

import fsspec
import optuna
import pytest
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


def _sweep(tmp_path: Any, name: str, n: int, **tune_config: Any) -> tune.ResultGrid:
    return tune.Tuner(
        _objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=n,
            sampler=optuna.samplers.RandomSampler(seed=0),
            **tune_config,
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
        _pool_factory=lambda resources: FakeWorkerPool(resources),
    ).fit()


def _files_after(tmp_path: Any, name: str, n: int) -> int:
    grid = _sweep(tmp_path, name, n)
    assert grid.num_terminated == n
    return sum(len(files) + len(dirs) for _, dirs, files in os.walk(tmp_path / name))


def test_a_sweep_without_checkpoints_or_loggers_writes_o1_files(tmp_path: Any) -> None:
    assert _files_after(tmp_path, "small", 5) == _files_after(tmp_path, "large", 60)


def test_finished_trials_are_kept_slim_and_equal(tmp_path: Any) -> None:
    path = str(tmp_path / "study.journal")
    storage, backend = _storage(path)
    study = optuna.create_study(study_name="s", storage=storage)
    for i in range(6):
        t = study.ask()
        x = t.suggest_float("x", 0, 1)
        t.suggest_categorical("opt", ["adam", "sgd"])
        t.report(x, step=1)
        if i == 4:
            study.tell(t, state=TrialState.PRUNED)
        else:
            study.tell(t, x)
    running = study.ask()
    running.suggest_float("x", 0, 1)
    backend.journal.flush()

    # The same trials, field for field, as a plain Optuna storage reading the journal.
    plain = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    expected = optuna.load_study(study_name="s", storage=plain).get_trials(deepcopy=False)
    kept = study.get_trials(deepcopy=False)
    assert kept == expected
    finished = [t for t in kept if t.state.is_finished()]
    assert len(finished) == 6
    # ...sharing one distributions dict and one empty dict; the running trial is Optuna's own.
    assert len({id(t.distributions) for t in finished}) == 1
    assert len({id(t.user_attrs) for t in finished}) == 1
    assert kept[-1].distributions is not finished[0].distributions
    assert finished[0].intermediate_values == {1: finished[0].params["x"]}
    # Samplers that read the history still work on the slim trials (deep copies too).
    tpe = optuna.create_study(
        study_name="s", storage=storage, load_if_exists=True, sampler=optuna.samplers.TPESampler()
    )
    assert 0 <= tpe.ask().suggest_float("x", 0, 1) <= 1
    assert study.trials == study.get_trials(deepcopy=False)

    # A new driver slims what it replays.
    reopened, _ = _storage(path)
    again = optuna.load_study(study_name="s", storage=reopened).get_trials(deepcopy=False)
    assert again[:6] == finished
    assert len({id(t.distributions) for t in again if t.state.is_finished()}) == 1


def test_a_finished_sweep_shares_params_and_keeps_no_default_names(tmp_path: Any) -> None:
    grid = _sweep(
        tmp_path,
        "slim",
        4,
        trial_name_creator=lambda t: "custom" if t.number == 1 else f"trial_{t.number:05d}",
    )
    assert [r.trial_name for r in grid] == ["trial_00000", "custom", "trial_00002", "trial_00003"]
    assert [r.trial_id for r in grid] == ["00000", "00001", "00002", "00003"]
    assert grid[2].path == os.path.join(str(tmp_path), "slim", "trial_00002")
    assert grid[2].metrics == {"loss": grid[2].config["x"], "training_iteration": 1}
    assert grid[2].metrics_dataframe["loss"].tolist() == [grid[2].config["x"]]
    best = grid.get_best_result()
    assert best is grid[[r.metrics["loss"] for r in grid].index(best.metrics["loss"])]
    assert len(grid.get_dataframe()) == 4
    assert grid[-1] is grid[3]
    with pytest.raises(IndexError, match="result index out of range"):
        grid[4]


def test_compacting_a_trial_changes_nothing_its_snapshot_shows() -> None:
    from lumos.tune._internal.live_trial import LiveTrial
    from lumos.tune._internal.trial import TrialStatus

    rows = [{"loss": 2.0, "training_iteration": 1}, {"loss": 1.0, "training_iteration": 2}]
    trial = LiveTrial(number=7, config={"x": 0.5}, params={"x": 0.5}, path="/exp/trial_00007")
    for i, row in enumerate(rows, 1):
        trial.apply_report(i, dict(row), None)
    trial.status = TrialStatus.TERMINATED
    before = trial.snapshot()
    study_params = {"x": 0.5}
    trial.compact(lambda number: [dict(r) for r in rows], study_params)
    after = trial.snapshot()
    for f in dataclasses.fields(after):
        if f.name != "history":
            assert getattr(after, f.name) == getattr(before, f.name), f.name
    assert list(after.history) == list(before.history) == rows
    assert trial.config is trial.params is study_params
    assert (trial.trial_id, trial.trial_name, trial.dir_name) == (
        "00007",
        "trial_00007",
        "trial_00007",
    )
    assert trial.path == "/exp/trial_00007"
    # A compacted trial can still be changed (a retry on restore): names, errors, reports.
    trial.errors = [*trial.errors]
    trial.trial_name = "renamed"
    trial.apply_report(3, {"loss": 0.5, "training_iteration": 3}, None)
    assert trial.trial_name == "renamed"
    assert trial.iteration == 3
    assert [r["loss"] for r in trial.history] == [2.0, 1.0, 0.5]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        trial.nope  # type: ignore[attr-defined]


def test_a_finished_trial_keeps_only_the_rare_fields_that_differ_from_their_default() -> None:
    from lumos.tune._internal.errors import TrialErrorRecord
    from lumos.tune._internal.live_trial import LiveTrial
    from lumos.tune._internal.trial import TrialStatus

    plain = LiveTrial(number=3, config={"x": 1.0}, params={"x": 1.0}, path="/e/trial_00003")
    plain.seen_metrics = frozenset({"loss"})
    plain.max_step_reported = 4
    plain.waiting_for_resources = True
    plain.status = TrialStatus.TERMINATED
    plain.compact(None, None)
    assert plain._more is None  # every rare field is back at its default: no dict kept
    assert (plain.path, plain.dir_name, plain.attempt, plain.errors) == (
        "/e/trial_00003",
        "trial_00003",
        0,
        (),
    )
    assert (plain.checkpoint_dir, plain.stop_reason, plain.max_step_reported) == (None, None, -1)

    error = TrialErrorRecord(
        trial_name="mine", attempt=1, exc_type="ValueError", error_message="boom"
    )
    odd = LiveTrial(number=4, config={"x": 2.0}, params={"x": 2.0}, path="/elsewhere/mine")
    odd.dir_name = "mine"
    odd.checkpoint_dir, odd.checkpoint_iteration = "checkpoint_000001", 1
    odd.attempt, odd.errors, odd.stop_reason = 2, [error], "stop"
    odd.status = TrialStatus.ERROR
    odd.compact(None, None)
    assert odd._more == {
        "path": "/elsewhere/mine",
        "dir_name": "mine",
        "checkpoint_dir": "checkpoint_000001",
        "checkpoint_iteration": 1,
        "attempt": 2,
        "errors": [error],
        "stop_reason": "stop",
    }
    assert odd.error is error
    del odd.checkpoint_dir
    assert odd.checkpoint_dir is None


def test_finished_trials_share_one_keys_table_for_their_params(tmp_path: Any) -> None:
    from lumos.tune._internal.journal import _SharedParts

    parts = _SharedParts()
    first = parts.params({"lr": 0.1, "batch_size": 32})
    second = parts.params({"lr": 0.2, "batch_size": 64})
    assert type(first) is dict
    assert first == {"lr": 0.1, "batch_size": 32}
    assert list(second) == ["lr", "batch_size"]
    second_copy = dict(second)
    second["lr"] = 0.3  # still an ordinary dict
    assert second == {**second_copy, "lr": 0.3}
    odd = parts.params({"model/width": 4})  # not an identifier: a table of its own
    assert odd == {"model/width": 4}
    # Never larger than a plain dict; smaller once a sweep has a few dozen trials.
    many = [parts.params({"lr": i / 10, "batch_size": i}) for i in range(64)]
    assert many[10] == {"lr": 1.0, "batch_size": 10}
    plain_size = sys.getsizeof({"lr": 0.1, "batch_size": 32})
    assert all(sys.getsizeof(d) <= plain_size for d in [first, second, odd, *many])
    if sys.implementation.name == "cpython":
        assert sys.getsizeof(many[-1]) < plain_size


def test_summary_rows_share_a_class_per_set_of_names_up_to_a_cap(monkeypatch: Any) -> None:
    import copy
    import pickle

    from lumos.tune._internal.trial_memory import SummaryRow

    first = SummaryRow.of({"loss": 0.5, "training_iteration": 3})
    second = SummaryRow.of({"loss": 0.25, "training_iteration": 4})
    assert type(first) is type(second)
    assert SummaryRow.of(first) is first
    assert first == {"loss": 0.5, "training_iteration": 3}
    assert (first["loss"], first.get("nope"), "loss" in first, list(first)) == (
        0.5,
        None,
        True,
        ["loss", "training_iteration"],
    )
    with pytest.raises(KeyError, match="nope"):
        first["nope"]
    assert pickle.loads(pickle.dumps(first)) == first == copy.deepcopy(first)
    assert repr(SummaryRow.of({})) == "{}"
    # Names that change from trial to trial stop making classes at the cap.
    monkeypatch.setattr(SummaryRow, "_MAX_CLASSES", len(SummaryRow._classes))
    odd = SummaryRow.of({"loss": 1.0, "a metric seen once": 2})
    assert type(odd).__name__ == "_TupleRow"
    assert dict(odd) == {"loss": 1.0, "a metric seen once": 2}
    assert odd["a metric seen once"] == 2
    assert pickle.loads(pickle.dumps(odd)) == odd
    assert type(SummaryRow.of({"loss": 0.1, "training_iteration": 1})) is type(first)


def test_params_of_other_types_are_not_shared() -> None:
    from lumos.tune._internal.live_trial import LiveTrial

    trial = LiveTrial(number=0, config={"n": 3}, params={"n": 3}, path="/exp/trial_00000")
    trial.compact(None, {"n": 3.0})
    assert trial.config == {"n": 3}
    assert type(trial.config["n"]) is int


def test_the_driver_trims_its_heap_every_so_many_trial_ends() -> None:
    from lumos.tune._internal.heap import HeapTrimmer, malloc_trim

    calls: list[int] = []
    trimmer = HeapTrimmer(every=3, trim=lambda pad: calls.append(pad) or 1)
    for _ in range(7):
        trimmer.note()
    assert calls == [0, 0]
    with pytest.raises(ValueError, match="every=0"):
        HeapTrimmer(every=0)
    if sys.platform.startswith("linux") and "glibc" in " ".join(platform.libc_ver()):
        trim = malloc_trim()
        assert trim is not None
        assert trim(0) in (0, 1)
