"""Every Tune write and read survives transient storage faults; permanent ones fail clearly.

Storage is a real S3 API (moto's server on loopback) behind ``FaultyFileSystem``:
transient faults (connection resets, ``TimeoutError(ETIMEDOUT)``, ``SlowDown``) are
retried by lumos-storage's policy and the operation succeeds; a permanent one raises
``StorageIOError`` naming the operation and the path, and what was stored before is
intact. Paths: the study and trial journals (local appends too), the experiment's
state, the tuner state, the study read back, population-based training's clones, and
the JSON / CSV loggers.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from ray import cloudpickle

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage import RunStorage, StorageIOError
from lumos.storage.testing import (
    FAST_RETRY_POLICY,
    FaultyFileSystem,
    S3Server,
    retry_policy,
    s3_server,
)
from lumos.tune._internal.controller import ControllerSettings, TuneController
from lumos.tune._internal.experiment import open_experiment
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.pbt import PopulationBasedTraining
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial import TrialStatus, trial_name
from lumos.tune._internal.trial_journal import EndRecord, ReportRecord, StartRecord, TrialJournal
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune._internal.tuner_state import load_tuner_state, save_tuner_state
from lumos.tune.testing import ScriptedExecutor, Step, report

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = FAST_RETRY_POLICY
KINDS = ("write", "rename", "list", "read", "delete")
ALL_TRANSIENT = {f"{kind}_failure_rate": 0.3 for kind in KINDS}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[None]:
    with retry_policy(FAST):
        yield


# -- the journals ----------------------------------------------------------------------


def test_trial_journal_on_faulty_s3_stores_every_record_once(s3: S3Server) -> None:
    fs = s3.faulty_filesystem(**ALL_TRANSIENT)
    path = f"{s3.create_bucket()}/exp/_lumos/trials.journal"
    journal = TrialJournal(FsJournal(fs, path))
    expected: list[Any] = []
    for n in range(6):
        records = [
            StartRecord(n, 0, 0),
            ReportRecord(n, 1, {"loss": float(n)}),
            EndRecord(n, TrialStatus.TERMINATED),
        ]
        journal.append(*records)
        assert journal.flush()
        expected.extend(records)
    assert fs.injected["write"] >= 1
    assert TrialJournal(FsJournal(s3.filesystem(), path, writable=False)).read() == expected
    assert TrialJournal(FsJournal(fs, path, writable=False)).read() == expected  # reads retried
    assert fs.injected["list"] + fs.injected["read"] >= 1


def test_a_journal_write_that_fails_for_good_keeps_what_was_flushed(s3: S3Server) -> None:
    fs = s3.faulty_filesystem()
    path = f"{s3.create_bucket()}/exp/_lumos/study.journal"
    journal = FsJournal(fs, path)
    journal.append([{"n": 1}])
    journal.flush()
    fs.set_faults(write_failure_rate=1.0, permanent=True)
    journal.append([{"n": 2}])
    with pytest.raises(StorageIOError) as info:
        journal.flush()
    err = info.value
    chunk = f"{path}.d/0000000001.jsonl"
    assert (err.operation, err.path, err.transient, err.attempts) == ("write", chunk, False, 1)
    assert f"Storage write failed on {chunk!r}: PermissionError" in str(err)
    assert journal.pending == 1  # kept for the next flush
    assert FsJournal(s3.filesystem(), path, writable=False).read() == [{"n": 1}]
    fs.clear_overrides()
    journal.append([{"n": 3}])
    journal.flush()  # the same chunk name, written whole: nothing twice
    assert FsJournal(s3.filesystem(), path, writable=False).read() == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_a_local_journal_append_torn_by_an_io_error_lands_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = LocalFileSystem()
    path = str(tmp_path / "_lumos" / "trials.journal")
    journal = FsJournal(fs, path)
    journal.append([{"n": 0}])
    journal.flush()
    real_write = os.write
    torn = [2]

    def half_then_eio(fd: int, data: bytes | memoryview) -> int:
        if torn[0] and len(data) > 8:
            torn[0] -= 1
            real_write(fd, bytes(data[: len(data) // 2]))  # half of the batch reaches the disk
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_eio)
    journal.append([{"n": 1}, {"n": 2}])
    journal.flush()
    monkeypatch.setattr(os, "write", real_write)
    journal.close()
    assert torn == [0]
    assert FsJournal(fs, path).read() == [{"n": 0}, {"n": 1}, {"n": 2}]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_local_journal_on_a_full_disk_fails_at_once_saying_so() -> None:
    journal = FsJournal(LocalFileSystem(), "/dev/full")  # every write: ENOSPC
    journal.append([{"n": 0}])
    with pytest.raises(
        StorageIOError, match=r"Storage append failed on '/dev/full'.*ENOSPC"
    ) as info:
        journal.flush()
    assert info.value.attempts == 1
    assert "no space left on device" in str(info.value).lower()


# -- the tuner state and the experiment --------------------------------------------------


def test_tuner_state_round_trips_through_faults_and_survives_a_failed_write(
    s3: S3Server,
) -> None:
    fs = s3.faulty_filesystem(write_failure_rate=0.5, read_failure_rate=0.5)
    storage = RunStorage(f"{s3.create_bucket()}/sweeps", "exp", fs)
    for x in range(4):
        save_tuner_state(storage, {"x": x}, {"metric": "loss"})
        assert load_tuner_state(storage) == {
            "param_space": {"x": x},
            "tune_config": {"metric": "loss"},
        }
    assert fs.injected["write"] >= 1
    assert fs.injected["read"] >= 1
    fs.set_faults(write_failure_rate=1.0, permanent=True)
    with pytest.raises(StorageIOError) as info:
        save_tuner_state(storage, {"x": 99}, None)
    assert (info.value.operation, info.value.path) == ("write", f"{storage.state_dir}/tuner.pkl")
    fs.clear_overrides()
    assert load_tuner_state(storage)["param_space"] == {"x": 3}


CFG = tune.TuneConfig(
    metric="loss", mode="min", num_samples=4, sampler=optuna.samplers.RandomSampler(seed=0)
)
SPACE = {"lr": tune.uniform(0.0, 1.0)}


def test_an_experiment_that_cannot_be_created_leaves_no_half_state(s3: S3Server) -> None:
    fs = s3.faulty_filesystem(write_failure_rate=1.0, permanent=True)
    storage = RunStorage(f"{s3.create_bucket()}/sweeps", "exp", fs)
    with pytest.raises(StorageIOError) as info:
        open_experiment(storage, SearchSpace(SPACE), CFG)
    assert info.value.operation == "write"
    assert info.value.path == storage.state_path
    clean = RunStorage(storage.storage_path, "exp", s3.filesystem())
    assert clean.load_state() is None


# -- population-based training's clones --------------------------------------------------


def _script(spec: TrialSpec) -> list[Step]:
    start, lr = spec.start_iteration, spec.config["lr"]
    return [
        report({"loss": 10.0 - lr * (start + i + 1)}, checkpoint=True) for i in range(8 - start)
    ]


def _pbt_sweep(storage: RunStorage) -> TuneController:
    cfg = tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=4,
        sampler=optuna.samplers.RandomSampler(seed=0),
        scheduler=PopulationBasedTraining(
            perturbation_interval=2, hyperparam_mutations=SPACE, seed=0, resample_probability=0.0
        ),
    )
    space = SearchSpace(SPACE)
    exp = open_experiment(storage, space, cfg)
    executor = ScriptedExecutor(_script, storage=storage)
    settings = ControllerSettings(max_concurrent_trials=4)
    return TuneController(exp, space, cfg, executor, settings, resources={"CPU": 1.0})


def test_pbt_clones_on_faulty_s3_are_committed_whole(s3: S3Server) -> None:
    fs = s3.faulty_filesystem(
        **{**ALL_TRANSIENT, "rename_failure_rate": 1.0}
    )  # 3 in a row, then through
    storage = RunStorage(f"{s3.create_bucket()}/sweeps", "pbt", fs)
    trials = _pbt_sweep(storage).run()
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    exploits = [(t, e) for t in trials for e in t.exploits]
    assert exploits, "no trial was exploited"
    assert fs.injected["rename"] >= 1, fs.calls  # clone copies were faulted, and retried
    clean = RunStorage(storage.storage_path, "pbt", s3.filesystem())
    for trial, exploit in exploits:
        trial_storage = clean.child(trial.dir_name)
        state = trial_storage.load_state()
        assert state is not None
        assert exploit.checkpoint_dir in state.checkpoint_names()
        clone = f"{trial_storage.checkpoint_path(exploit.checkpoint_dir)}/state.json"
        donor = clean.child(trial_name(exploit.donor)).checkpoint_path(exploit.donor_checkpoint)
        assert clean.fs.cat_file(clone) == clean.fs.cat_file(f"{donor}/state.json")
    restored = open_experiment(
        clean, SearchSpace(SPACE), tune.TuneConfig(metric="loss", mode="min")
    )
    assert {t.number: t.exploits for t in restored.trials} == {t.number: t.exploits for t in trials}
    restored.close()


def test_a_pbt_clone_that_fails_for_good_stops_the_sweep_and_keeps_committed_state(
    s3: S3Server,
) -> None:
    fs = s3.faulty_filesystem(rename_failure_rate=1.0, permanent=True)  # only clones copy objects
    storage = RunStorage(f"{s3.create_bucket()}/sweeps", "pbt", fs)
    with pytest.raises(StorageIOError) as info:
        _pbt_sweep(storage).run()
    err = info.value
    assert err.operation == "copy"
    assert "/checkpoint_" in err.path
    assert not err.transient
    clean = RunStorage(storage.storage_path, "pbt", s3.filesystem())
    replay = TrialJournal(FsJournal(clean.fs, f"{clean.state_dir}/trials.journal", False)).replay()
    assert replay
    assert all(events.exploits == [] for events in replay.values())
    for number in replay:
        trial_storage = clean.child(trial_name(number))
        state = trial_storage.load_state()
        assert state is not None
        assert state.checkpoints
        assert all("_from_" not in name for name in state.checkpoint_names())
        with trial_storage.checkpoint(state.checkpoint_names()[-1]).as_directory() as d:
            assert json.loads(Path(d, "state.json").read_text())["iteration"] >= 1


# -- whole sweeps: Tuner.fit on faulty S3, the loggers, the study read back --------------


def _trainable(config: dict[str, Any]) -> None:
    start = 0
    if (ckpt := tune.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(Path(d, "step").read_text()) + 1
    for step in range(start, 3):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "step").write_text(str(step))
            tune.report({"loss": config["x"] + step}, checkpoint=tune.Checkpoint.from_directory(d))


def _fit(bucket: str, fs: AbstractFileSystem, name: str = "sweep") -> tune.ResultGrid:
    return tune.Tuner(
        _trainable,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=3,
            max_concurrent_trials=2,
            sampler=optuna.samplers.RandomSampler(seed=0),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=f"s3://{bucket}/sweeps",
            storage_filesystem=fs,
            verbose=0,
            callbacks=[tune.JSONLoggerCallback(), tune.CSVLoggerCallback()],
        ),
        _pool_factory=lambda r: FakeWorkerPool(r),
    ).fit()


def test_a_sweep_on_faulty_s3_finishes_and_its_files_and_study_read_back(
    s3: S3Server, tmp_path: Path
) -> None:
    bucket = s3.create_bucket()
    fs = s3.faulty_filesystem(**ALL_TRANSIENT)
    grid = _fit(bucket, fs)
    assert grid.num_terminated == 3, grid.errors
    assert {"write", "list", "read"} <= set(fs.injected), fs.injected
    clean = s3.filesystem()
    for result in grid:
        lines = clean.cat_file(f"{result.path.removeprefix('s3://')}/result.json").splitlines()
        x = result.config["x"]
        assert [json.loads(line)["loss"] for line in lines] == [x + step for step in range(3)]
        csv_rows = clean.cat_file(f"{result.path.removeprefix('s3://')}/progress.csv").splitlines()
        assert len(csv_rows) == 1 + 3  # header + one row per report
    study = tune.load_study(f"s3://{bucket}/sweeps", "sweep", storage_filesystem=fs)
    assert sorted(t.value for t in study.trials) == sorted(r.metrics["loss"] for r in grid)
    local = tune.export_study_journal(
        f"s3://{bucket}/sweeps", "sweep", str(tmp_path / "study.journal"), storage_filesystem=fs
    )
    assert len(Path(local).read_text().splitlines()) > 3
    fs.set_faults(read_failure_rate=1.0, permanent=True)
    with pytest.raises(StorageIOError, match=r"Storage (read|list) failed on .*study\.journal\.d"):
        tune.load_study(f"s3://{bucket}/sweeps", "sweep", storage_filesystem=fs)


class LoggerFilesRefused(FaultyFileSystem):
    """S3 that refuses (``PermissionError``) every write of a logger's file, nothing else."""

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        """Refuse ``result.json`` / ``progress.csv``; write anything else."""
        if str(path).endswith(("/result.json", "/progress.csv")):
            raise PermissionError(errno.EACCES, f"injected: access denied to {path!r}")
        return super().pipe_file(path, value, mode=mode, **kwargs)


def test_a_logger_file_refused_for_good_is_a_warning_not_a_failed_sweep(
    s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3.create_bucket()
    with caplog.at_level(logging.WARNING, logger="lumos.tune"):
        grid = _fit(bucket, LoggerFilesRefused(s3.filesystem()), name="refused")
    assert grid.num_terminated == 3
    refused = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(refused) == 2 * 3  # both loggers, every trial
    assert all("Storage write failed on" in m and "PermissionError" in m for m in refused)
    clean = s3.filesystem()
    assert not clean.exists(f"{grid[0].path.removeprefix('s3://')}/result.json")
