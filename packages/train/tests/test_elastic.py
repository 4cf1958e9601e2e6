"""Elastic resizing and preemption in the controller, without Ray (FakeCluster).

The same on a real multi-node Ray cluster: tests/cluster/test_elastic_train.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import health_fns
import pytest
from conftest import run_config

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage


def _fit(
    tmp_path: Path,
    cluster: FakeCluster,
    config: dict[str, Any],
    workers: int | tuple[int, int] = (2, 3),
    **run_kwargs: Any,
) -> tuple[train.Result, list[dict[str, Any]]]:
    log = str(tmp_path / "log.jsonl")
    trainer = train.DataParallelTrainer(
        health_fns.loop,
        train_loop_config={"log": log, "step_s": 0.02, **config},
        scaling_config=train.ScalingConfig(
            num_workers=workers, elastic_resize_monitor_interval_s=0.05
        ),
        run_config=run_config(tmp_path, **run_kwargs),
        _group_factory=cluster.start,
    )
    result = trainer.fit()
    return result, [r for r in health_fns.read_log(log) if "start" in r]


def _steps(result: train.Result) -> list[int]:
    return [row["step"] for row in result.metrics_history]


def test_starts_with_what_fits_and_grows_at_a_checkpoint(tmp_path: Path) -> None:
    def capacity_returns(group: Any) -> None:
        group.after_reports(6, lambda g: setattr(g, "free_workers", 1))

    cluster = FakeCluster([capacity_returns], fit=2)
    result, starts = _fit(tmp_path, cluster, {"steps": 12})
    assert [s["size"] for s in starts] == [2, 3]
    # resumed from a checkpoint at or after step=2, the 6th report's (both ranks' step 2):
    # the capacity comes inside that batch of events, and the grow may take the boundary
    # of step=2's commit in the same driver loop (a loaded machine) or the next one
    assert starts[1]["start"] >= 3
    assert _steps(result) == list(range(12))  # no reported step lost or repeated
    (resize,) = cluster.groups[0].resizes
    assert resize.added == [2]
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["resized", "finished"]


def test_a_lost_worker_without_capacity_shrinks_the_group(tmp_path: Path) -> None:
    cluster = FakeCluster([lambda g: g.after_reports(8, lambda g: g.kill_worker(2))], fit=3)
    result, starts = _fit(
        tmp_path, cluster, {"steps": 10}, failure_config=train.FailureConfig(max_failures=1)
    )
    assert [s["size"] for s in starts] == [3, 2]
    assert _steps(result) == list(range(10))
    assert cluster.groups[0].resizes[0].removed == [2]
    assert len(cluster.groups) == 1  # survivors kept their processes


def test_a_lost_worker_is_refilled_where_capacity_exists(tmp_path: Path) -> None:
    def script(group: Any) -> None:
        group.free_workers = 1
        group.after_reports(8, lambda g: g.kill_worker(0))

    cluster = FakeCluster([script], fit=3)
    result, starts = _fit(
        tmp_path, cluster, {"steps": 10}, failure_config=train.FailureConfig(max_failures=1)
    )
    assert [s["size"] for s in starts] == [3, 3]
    assert _steps(result) == list(range(10))


def test_preempted_ranks_checkpoint_and_move_without_using_max_failures(tmp_path: Path) -> None:
    def notice(group: Any) -> None:
        group.after_reports(6, lambda g: g.preempt_workers([1], reason="node draining"))

    cluster = FakeCluster([notice], fit=3)
    result, starts = _fit(tmp_path, cluster, {"steps": 10, "every": 100, "on_notice": True})
    assert [s["size"] for s in starts] == [3, 2]  # no capacity elsewhere: an elastic shrink
    assert _steps(result) == list(range(10))
    # the only checkpoints are those taken because of the notice: nothing was redone
    assert starts[1]["start"] == int(result.best_checkpoints[0][0].path.rsplit("=", 1)[1]) + 1
    assert cluster.groups[0].resizes[0].removed == [1]


def test_a_fixed_size_group_moves_to_a_new_group_on_a_notice(tmp_path: Path) -> None:
    def notice(group: Any) -> None:
        group.after_reports(4, lambda g: g.preempt_workers([0], reason="SIGTERM"))

    cluster = FakeCluster([notice])
    result, starts = _fit(tmp_path, cluster, {"steps": 8, "on_notice": True}, workers=2)
    assert [s["size"] for s in starts] == [2, 2]
    assert len(cluster.groups) == 2
    assert _steps(result) == list(range(8))


def test_preempted_ranks_lost_before_a_checkpoint_use_their_own_budget(tmp_path: Path) -> None:
    def notice_then_death(group: Any) -> None:
        group.after_reports(4, lambda g: g.preempt_workers([1], reason="node draining"))
        group.after_reports(5, lambda g: g.kill_worker(1))

    cluster = FakeCluster([notice_then_death], fit=3)
    result, starts = _fit(tmp_path, cluster, {"steps": 8, "every": 100})  # max_failures=0
    assert _steps(result) == list(range(8))
    assert [s["size"] for s in starts] == [3, 2]

    cluster = FakeCluster([notice_then_death], fit=3)
    with pytest.raises(train.TrainingFailedError, match="max_preemption_failures=0"):
        _fit(
            tmp_path / "strict",
            cluster,
            {"steps": 8, "every": 100},
            failure_config=train.FailureConfig(max_preemption_failures=0),
        )
