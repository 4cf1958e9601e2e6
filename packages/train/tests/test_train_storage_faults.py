"""A Train run on faulty S3 (moto's server on loopback behind ``FaultyFileSystem``).

Transient faults (connection resets, ``TimeoutError(ETIMEDOUT)``, ``SlowDown``) in the
run state, checkpoint uploads, the metrics history and the data-loader positions are
retried and the run finishes as if storage were healthy; a permanent fault raises
``StorageIOError`` naming the operation and the path, and leaves what was stored as it
was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import train_fns

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage, StorageIOError
from lumos.train._internal.data_positions import positions_path, read_positions, write_positions

pytest.importorskip("moto")
pytest.importorskip("s3fs")

from lumos.storage.testing import FAST_RETRY_POLICY, S3Server, retry_policy, s3_server

FAST = FAST_RETRY_POLICY
RATES = {f"{kind}_failure_rate": 0.3 for kind in ("write", "rename", "list", "read", "delete")}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[None]:
    with retry_policy(FAST):
        yield


def test_a_run_on_faulty_s3_commits_every_checkpoint_and_metric(s3: S3Server) -> None:
    bucket = s3.create_bucket()
    fs = s3.faulty_filesystem(**RATES)
    trainer = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": 4},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="run", storage_path=f"{bucket}/runs", storage_filesystem=fs, verbose=False
        ),
        _group_factory=FakeCluster().start,
    )
    result = trainer.fit()
    assert result.error is None
    assert {"write", "list", "read"} <= set(fs.injected), fs.injected
    clean = RunStorage(f"{bucket}/runs", "run", s3.filesystem())
    state = clean.load_state()
    assert state is not None
    assert state.status == "finished"
    assert state.checkpoint_names() == [f"checkpoint_{i}" for i in range(4)]
    assert [row["step"] for row in clean.read_metrics()] == [0, 1, 2, 3]
    with clean.checkpoint("checkpoint_3").as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text())["step"] == 3
        assert sorted(p.name for p in Path(d).glob("shard_*")) == ["shard_0.txt", "shard_1.txt"]


def test_loader_positions_through_faults_and_a_failed_write(s3: S3Server) -> None:
    fs = s3.faulty_filesystem(write_failure_rate=0.5, read_failure_rate=0.5)
    storage = RunStorage(f"{s3.create_bucket()}/runs", "run", fs)
    for i in range(4):
        write_positions(storage, f"checkpoint_{i}", {0: b"r0-%d" % i, 1: b"r1-%d" % i}, 2)
        assert read_positions(storage, f"checkpoint_{i}") == (2, {0: b"r0-%d" % i, 1: b"r1-%d" % i})
    assert read_positions(storage, "checkpoint_9") is None
    assert fs.injected["write"] >= 1
    assert fs.injected["read"] >= 1
    fs.set_faults(write_failure_rate=1.0, permanent=True)
    with pytest.raises(StorageIOError) as info:
        write_positions(storage, "checkpoint_3", {0: b"new"}, 1)
    assert info.value.operation == "write"
    assert info.value.path == positions_path(storage, "checkpoint_3")
    assert not info.value.transient
    fs.clear_overrides()
    assert read_positions(storage, "checkpoint_3") == (2, {0: b"r0-3", 1: b"r1-3"})
