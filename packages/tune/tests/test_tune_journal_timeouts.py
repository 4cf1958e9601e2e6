"""Regression (issue 31): a sweep on S3 whose journal writes time out still finishes.

The soak's driver died on every restart: the first write of each journal chunk
(``controller._housekeeping`` -> ``Experiment.flush`` -> ``FsJournal.flush`` ->
``pipe_file``) raised ``TimeoutError(ETIMEDOUT)``, errno 110, and the journal did not
retry it, so the sweep never finished. Here S3 is a real API (moto's server on
loopback) that times out twice on every journal chunk before taking it; the sweep
must finish, store each trial once, and resume to the same results.

Only names that existed before the fix are imported: run against the old tree, the
sweep raises the TimeoutError.
"""

from __future__ import annotations

import collections
import errno
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import optuna
import pytest
from fsspec import AbstractFileSystem
from ray import cloudpickle

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage import RetryPolicy
from lumos.storage.testing import (
    FaultyFileSystem,
    S3Server,
    retry_policy,
    s3_server,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST = RetryPolicy(max_attempts=6, initial_backoff_s=0.001, max_backoff_s=0.01, max_total_s=30.0)
TIMEOUTS_PER_CHUNK = 2


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[None]:
    with retry_policy(FAST):
        yield


class JournalTimeouts(FaultyFileSystem):
    """S3 whose journal chunk writes time out ``TIMEOUTS_PER_CHUNK`` times each first.

    Every ``.journal.d/<seq>.jsonl`` PUT raises ``TimeoutError(ETIMEDOUT)`` before it
    reaches the server, as the soak's injected faults did; other calls pass through.
    """

    def __init__(self, fs: AbstractFileSystem, **kwargs: Any) -> None:
        super().__init__(fs, **kwargs)
        self.timeouts: collections.Counter[str] = collections.Counter()

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        """Time out on a journal chunk's first attempts, then write it."""
        if ".journal.d/" in str(path) and self.timeouts[str(path)] < TIMEOUTS_PER_CHUNK:
            self.timeouts[str(path)] += 1
            raise TimeoutError(errno.ETIMEDOUT, f"injected timeout writing {path!r}")
        return super().pipe_file(path, value, mode=mode, **kwargs)


def _trainable(config: dict[str, Any]) -> None:
    start = 0
    if (ckpt := tune.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, "step")).read()) + 1
    for step in range(start, 3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            tune.report({"loss": config["x"] + step}, checkpoint=tune.Checkpoint.from_directory(d))


def _fit(bucket: str, fs: AbstractFileSystem) -> tune.ResultGrid:
    return tune.Tuner(
        _trainable,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=4,
            max_concurrent_trials=2,
            sampler=optuna.samplers.RandomSampler(seed=0),
        ),
        run_config=tune.RunConfig(
            name="soak-like", storage_path=f"s3://{bucket}/sweeps", storage_filesystem=fs, verbose=0
        ),
        _pool_factory=lambda r: FakeWorkerPool(r),
    ).fit()


def test_a_sweep_whose_journal_writes_time_out_finishes_and_resumes(s3: S3Server) -> None:
    bucket = s3.create_bucket()
    fs = JournalTimeouts(s3.filesystem())
    grid = _fit(bucket, fs)
    assert grid.num_terminated == 4, grid.errors
    chunks = sorted(fs.timeouts)
    assert chunks, "no journal chunk was written"
    assert {p.rsplit("/", 2)[-2] for p in chunks} == {"study.journal.d", "trials.journal.d"}
    assert set(fs.timeouts.values()) == {TIMEOUTS_PER_CHUNK}  # each timed out, then landed

    # Every chunk landed once: a clean reader sees every trial's three reports, once each.
    clean = s3.filesystem()
    trials_dir = f"{bucket}/sweeps/soak-like/_lumos/trials.journal.d"
    lines = [
        line
        for name in sorted(clean.ls(trials_dir, detail=False))
        for line in clean.cat_file(name).decode().splitlines()
    ]
    reports = [line for line in lines if '"e":"r"' in line]
    assert len(reports) == 4 * 3

    again = _fit(bucket, JournalTimeouts(s3.filesystem()))  # a restart: resumes, runs nothing
    assert sorted(r.metrics["loss"] for r in again) == sorted(r.metrics["loss"] for r in grid)
    assert again.num_terminated == 4
