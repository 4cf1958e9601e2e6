"""Upload modes against a real S3 API (moto's server on loopback), on the fake worker group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import report_fns

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage

pytest.importorskip("moto")
pytest.importorskip("s3fs")

from lumos.storage.testing import S3Server, s3_server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def _trainer(
    fn: object, config: dict[str, object], s3: S3Server, tmp_path: Path
) -> train.DataParallelTrainer:
    bucket = s3.create_bucket()
    rc = train.RunConfig(
        name="run", storage_path=f"{bucket}/runs", storage_filesystem=s3.filesystem(), verbose=False
    )
    return train.DataParallelTrainer(
        fn,  # type: ignore[arg-type]
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=rc,
        _group_factory=FakeCluster().start,
    )


def test_async_uploads_to_s3_commit_in_order(s3: S3Server, tmp_path: Path) -> None:
    trainer = _trainer(report_fns.ray_docs_pattern, {"epochs": 3, "mode": "ASYNC"}, s3, tmp_path)
    result = trainer.fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/runs/run/epoch=2")
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]
    storage = RunStorage(trainer.run_config.storage_path or "", "run", s3.filesystem())
    with storage.checkpoint("epoch=1").as_directory() as d:
        assert sorted(p.name for p in Path(d).iterdir()) == ["model.json"]


def test_no_upload_registers_a_checkpoint_written_to_s3(s3: S3Server, tmp_path: Path) -> None:
    result = _trainer(report_fns.no_upload, {}, s3, tmp_path).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("/runs/run/dcp_1")
    with result.checkpoint.as_directory() as d:
        assert sorted(p.name for p in Path(d).iterdir()) == ["shard_0.json", "shard_1.json"]
