"""ReportAggregator alone: reports in, commits out (no Ray, no storage)."""

from __future__ import annotations

import pytest

from lumos.train import CheckpointReportError
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.wire import RankReport


def rep(index: int, dir_name: str | None = None, **metrics: float) -> RankReport:
    return RankReport(index, dict(metrics), dir_name)


def arep(index: int, dir_name: str, **metrics: float) -> RankReport:
    """A report whose checkpoint this rank still uploads in the background (ASYNC)."""
    return RankReport(index, dict(metrics), dir_name, upload_pending=True)


def test_metrics_only_reports_never_commit() -> None:
    agg = ReportAggregator(world_size=2)
    for i in range(3):
        assert agg.add(1, rep(i, x=i)) == []
        assert agg.add(0, rep(i, x=i)) == []
    agg.finished(0)
    agg.finished(1)


def test_a_checkpoint_commits_once_every_rank_reported_it_with_rank0_metrics() -> None:
    agg = ReportAggregator(world_size=3)
    assert agg.add(2, rep(0, "ckpt", loss=2.0)) == []
    assert agg.add(0, rep(0, "ckpt", loss=0.0)) == []
    commits = agg.add(1, rep(0, "ckpt", loss=1.0))
    assert commits == [Commit(index=0, dir_name="ckpt", metrics={"loss": 0.0}, ranks=(0, 1, 2))]


def test_only_the_ranks_that_uploaded_wait_for_the_commit() -> None:
    agg = ReportAggregator(world_size=3)
    assert agg.add(0, rep(4, None, loss=0.5)) == []
    assert agg.add(1, rep(4, "shard")) == []
    commits = agg.add(2, rep(4, "shard"))
    assert commits == [Commit(index=4, dir_name="shard", metrics={"loss": 0.5}, ranks=(1, 2))]


def test_reports_of_different_indices_are_kept_apart() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, "c0", step=0)) == []
    assert agg.add(0, rep(1, None, step=1)) == []
    assert agg.add(1, rep(1, None, step=1)) == []
    [commit] = agg.add(1, rep(0, "c0", step=0))
    assert (commit.index, commit.dir_name) == (0, "c0")


def test_different_checkpoint_dir_names_raise_naming_every_rank() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, "ckpt_rank0")) == []
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
    assert agg.add(0, rep(0, "ckpt")) == []
    with pytest.raises(CheckpointReportError, match=r"report #0, which rank\(s\) \[0\]"):
        agg.finished(1)


def test_a_finished_rank_does_not_matter_for_metrics_only_reports() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, rep(0, None, x=1)) == []
    agg.finished(1)  # no checkpoint waits for rank 1
    assert agg.add(0, rep(1, None, x=2)) == []


def test_the_ray_docs_pattern_commits_rank0s_checkpoint_under_its_name() -> None:
    # only rank 0 passes a checkpoint; every rank passes the same name
    agg = ReportAggregator(world_size=2)
    assert agg.add(1, rep(0, None, loss=1.0)) == []
    [commit] = agg.add(0, rep(0, "epoch=0", loss=0.5))
    assert commit == Commit(index=0, dir_name="epoch=0", metrics={"loss": 0.5}, ranks=(0,))


def test_an_async_report_commits_only_once_every_upload_finished() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, arep(0, "c0", x=0)) == []
    assert agg.add(1, arep(0, "c0")) == []  # complete, but both uploads run
    assert agg.in_flight() == [0]
    assert agg.uploaded(1, 0) == []
    [commit] = agg.uploaded(0, 0)
    assert commit.dir_name == "c0"
    assert agg.in_flight() == []


def test_commits_stay_in_report_order_when_a_later_upload_finishes_first() -> None:
    agg = ReportAggregator(world_size=1)
    assert agg.add(0, arep(0, "c0")) == []
    assert agg.add(0, arep(1, "c1")) == []
    assert agg.add(0, rep(2, None, x=2)) == []
    assert agg.add(0, arep(3, "c3")) == []
    assert agg.uploaded(0, 3) == []  # c3 waits for c0 and c1
    assert agg.uploaded(0, 1) == []
    assert [c.dir_name for c in agg.uploaded(0, 0)] == ["c0", "c1", "c3"]


def test_an_upload_that_finishes_before_its_report_is_complete_is_remembered() -> None:
    agg = ReportAggregator(world_size=2)
    assert agg.add(0, arep(0, "c0")) == []
    assert agg.uploaded(0, 0) == []  # rank 1 has not reported #0 yet
    assert [c.dir_name for c in agg.add(1, rep(0, "c0"))] == ["c0"]


def test_a_sync_report_behind_an_async_one_waits_for_it() -> None:
    agg = ReportAggregator(world_size=1)
    assert agg.add(0, arep(0, "c0")) == []
    assert agg.add(0, rep(1, "c1")) == []  # already uploaded, but #0 is not committed
    assert [c.dir_name for c in agg.uploaded(0, 0)] == ["c0", "c1"]


def test_a_committed_name_is_refused() -> None:
    agg = ReportAggregator(world_size=1, committed_names=["epoch=0"])
    with pytest.raises(CheckpointReportError, match="name of a committed checkpoint"):
        agg.add(0, rep(3, "epoch=0"))
    agg2 = ReportAggregator(world_size=1)
    assert len(agg2.add(0, rep(0, "c"))) == 1
    with pytest.raises(CheckpointReportError, match="'c', the name of a committed"):
        agg2.add(0, rep(1, "c"))


def test_the_name_of_a_checkpoint_still_uploading_is_refused() -> None:
    agg = ReportAggregator(world_size=1)
    assert agg.add(0, arep(0, "c")) == []
    with pytest.raises(CheckpointReportError, match="report #0's checkpoint, which is not"):
        agg.add(0, rep(1, "c"))
