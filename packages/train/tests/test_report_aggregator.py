"""ReportAggregator alone: reports in, commits out (no Ray, no storage)."""

from __future__ import annotations

import pytest

from lumos.train import CheckpointReportError
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.session import RankReport


def rep(index: int, dir_name: str | None = None, **metrics: float) -> RankReport:
    return RankReport(index, dict(metrics), dir_name)


def test_metrics_only_reports_never_commit() -> None:
    agg = ReportAggregator(world_size=2)
    for i in range(3):
        assert agg.add(1, rep(i, x=i)) is None
        assert agg.add(0, rep(i, x=i)) is None
    agg.finished(0)
    agg.finished(1)


def test_a_checkpoint_commits_once_every_rank_reported_it_with_rank0_metrics() -> None:
    agg = ReportAggregator(world_size=3)
    assert agg.add(2, rep(0, "ckpt", loss=2.0)) is None
    assert agg.add(0, rep(0, "ckpt", loss=0.0)) is None
    commit = agg.add(1, rep(0, "ckpt", loss=1.0))
    assert commit == Commit(index=0, dir_name="ckpt", metrics={"loss": 0.0}, ranks=(0, 1, 2))


def test_only_the_ranks_that_uploaded_wait_for_the_commit() -> None:
    agg = ReportAggregator(world_size=3)
    assert agg.add(0, rep(4, None, loss=0.5)) is None
    assert agg.add(1, rep(4, "shard")) is None
    commit = agg.add(2, rep(4, "shard"))
    assert commit == Commit(index=4, dir_name="shard", metrics={"loss": 0.5}, ranks=(1, 2))


def test_reports_of_different_indices_are_kept_apart() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, "c0", step=0)) is None
    assert agg.add(0, rep(1, None, step=1)) is None
    assert agg.add(1, rep(1, None, step=1)) is None
    commit = agg.add(1, rep(0, "c0", step=0))
    assert commit is not None
    assert (commit.index, commit.dir_name) == (0, "c0")


def test_different_checkpoint_dir_names_raise_naming_every_rank() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, "ckpt_rank0")) is None
    with pytest.raises(CheckpointReportError) as info:
        agg.add(1, rep(0, "ckpt_rank1"))
    text = str(info.value)
    assert "different checkpoint_dir_name" in text
    assert "rank 0: 'ckpt_rank0'" in text
    assert "rank 1: 'ckpt_rank1'" in text
    assert isinstance(info.value, ValueError)


def test_a_rank_that_finished_before_a_checkpoint_report_fails_it() -> None:
    agg = ReportAggregator(world_size=2)
    agg.finished(1)
    with pytest.raises(CheckpointReportError, match=r"rank\(s\) \[1\] returned without"):
        agg.add(0, rep(0, "ckpt"))


def test_a_rank_that_finishes_while_a_checkpoint_waits_for_it_fails_it() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, "ckpt")) is None
    with pytest.raises(CheckpointReportError, match=r"report #0, which rank\(s\) \[0\]"):
        agg.finished(1)


def test_a_finished_rank_does_not_matter_for_metrics_only_reports() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, None, x=1)) is None
    agg.finished(1)  # no checkpoint waits for rank 1
    assert agg.add(0, rep(1, None, x=2)) is None
