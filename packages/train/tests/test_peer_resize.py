"""Elastic runs under peer recovery (``TorchftConfig``, ``num_workers=(min, max)``): the
group shrinks, grows back and moves preempted ranks while the others train on.

On a fake cluster (no Ray): the policies' decisions, the group driver's vacancies and
the controller through ``fit()``. The same with real torchft replicas on a simulated
multi-node Ray cluster: ``tests/cluster/test_peer_resize_ray.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config

from lumos import train
from lumos.runtime import (
    NoopDecision,
    ResizeDecision,
    ResizePolicy,
    RuntimeUsageError,
    WorkerGroupSpec,
)
from lumos.runtime.testing import FakeCluster
from lumos.train._internal.backend import Backend
from lumos.train._internal.console import Console
from lumos.train._internal.controller.components.elastic import ElasticComponent
from lumos.train._internal.controller.components.peer_resize import PeerResize
from lumos.train._internal.controller.group import GroupDriver

# -- the decision ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "live", "vacant", "size", "expected"),
    [
        (ResizeDecision(3), 2, 1, 3, (1, 0)),  # room for the lost rank: refill it
        (ResizeDecision(2), 2, 1, 3, (0, 0)),  # no room: it stays vacant
        (ResizeDecision(3), 1, 2, 3, (2, 0)),
        (ResizeDecision(2), 1, 2, 3, (1, 0)),  # room for one of the two
        (ResizeDecision(4), 2, 1, 3, (1, 1)),  # refill first, then add
        (ResizeDecision(3), 2, 0, 2, (0, 1)),  # no vacancy: the group grows
        (NoopDecision("no room"), 2, 1, 3, (0, 0)),
    ],
)
def test_peer_joins_refill_vacant_ranks_before_adding(
    decision: Any, live: int, vacant: int, size: int, expected: tuple[int, int]
) -> None:
    assert ResizePolicy(elastic=True).peer_joins(decision, live, vacant, size) == expected


def test_a_fixed_size_policy_never_joins() -> None:
    assert ResizePolicy(elastic=False).peer_joins(ResizeDecision(3), 2, 1, 3) == (0, 0)


# -- the group driver and PeerResize on a fake group ----------------------------------------------


def _resize(fit: int, workers: tuple[int, int] = (2, 3)) -> tuple[PeerResize, GroupDriver, Any]:
    from lumos.runtime import ElasticScalingPolicy

    cluster = FakeCluster(fit=fit)
    console = Console(verbose=0)
    driver = GroupDriver(cluster.start, console, shutdown_grace_s=1.0, stop_grace_s=1.0)
    low, high = workers
    group = driver.start(WorkerGroupSpec(num_workers=high, min_workers=low))
    elastic = ElasticComponent(
        driver,
        console,
        policy=ResizePolicy(elastic=True),
        scaling=ElasticScalingPolicy(),
        interval_s=0.0,
        min_workers=low,
    )
    return PeerResize(driver, elastic, console), driver, group


def test_a_lost_rank_without_room_stays_vacant_and_keeps_the_others_numbers() -> None:
    resize, driver, group = _resize(fit=3)
    group.kill_worker(1)
    assert resize.after_loss([1]) == []  # nobody joins, nothing is re-numbered
    assert driver.vacant == {1}
    assert len(group.workers) == 3
    assert group.scaling_state().lost_ranks == (1,)
    with pytest.raises(RuntimeUsageError, match="vacant"):
        group.launch(lambda: None)  # a launch on every rank would miss rank 1
    group.free_workers = 1  # room comes back
    assert resize.step(running={0, 2}) == [1]
    assert driver.vacant == set()
    assert group.workers[1].node_id.startswith("fake-node-added-")


def test_a_lost_rank_with_room_gets_a_new_worker_at_once() -> None:
    resize, driver, group = _resize(fit=3)
    group.free_workers = 1
    assert resize.after_loss([2]) == [2]
    assert driver.vacant == set()


def test_below_min_workers_the_loss_takes_the_ordinary_path() -> None:
    resize, driver, group = _resize(fit=2, workers=(2, 3))
    assert resize.after_loss([0]) is None  # one rank left, min_workers=2
    assert driver.vacant == {0}
    # the restart drops the vacant rank with the lost ones (no re-numbering left behind)
    driver.resize([], 2, wait_s=0.0)
    assert driver.vacant == set()
    assert len(group.workers) == 1


def test_ranks_under_a_notice_move_at_once_and_the_notice_is_settled() -> None:
    resize, _driver, group = _resize(fit=3)
    group.preempt_workers([0], reason="node draining")
    resize._elastic.on_preempted(group.poll(0)[0])
    assert resize.step(running={0, 1, 2}) == []  # no room elsewhere: it stays, tried again
    group.free_workers = 1
    assert resize.step(running={0, 1, 2}) == [0]
    assert resize._elastic.notices == {}
    assert group.preemption_info() is None


# -- the controller on a fake cluster: fit() ------------------------------------------------------
STARTS: list[tuple[int, float]] = []
CURRENT = [""]
"""The running test's ``tmp_path``: only its runs' ranks count in ``STARTS``. On a loaded
machine (nox's sessions two at a time) a fake worker thread of the test before started
its function after that test's ``fit()`` had returned, and this test saw rank 0 start
twice ([0, 0, 1, 1] where [0, 1, 1] was due)."""


@pytest.fixture(autouse=True)
def _this_test(tmp_path: Path) -> None:
    CURRENT[0] = str(tmp_path)


def _started(rank: int) -> None:
    if str(train.get_context().get_storage().run_path).startswith(CURRENT[0]):
        STARTS.append((rank, time.monotonic()))


def _stepping(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    _started(rank)
    for step in range(config["n"]):
        train.report({"step": step})
        time.sleep(0.003)


class _PeerBackend(Backend):
    peer_recovery = True


class _PeerTrainer(train.DataParallelTrainer):
    def _backend(self) -> Backend:
        return _PeerBackend()


def _fit(tmp_path: Path, script: Any, n: int = 60, fit: int = 3, **run: Any) -> Any:
    cluster = FakeCluster([script], fit=fit)
    trainer = _PeerTrainer(
        _stepping,
        train_loop_config={"n": n},
        scaling_config=train.ScalingConfig(
            num_workers=(2, 3), elastic_resize_monitor_interval_s=0.02
        ),
        run_config=run_config(tmp_path, "elastic-peers", **run),
        _group_factory=cluster.start,
    )
    result = trainer.fit()
    assert trainer._last_controller is not None
    states = [s.name for s in trainer._last_controller.history]
    return result, cluster.groups, states


FAILURES = train.FailureConfig(max_failures=2)


def test_a_lost_rank_shrinks_the_group_without_restarting_the_survivors(tmp_path: Path) -> None:
    STARTS.clear()
    result, groups, states = _fit(
        tmp_path, lambda g: g.after_reports(9, lambda g: g.kill_worker(2)), failure_config=FAILURES
    )
    assert sorted(r for r, _ in STARTS) == [0, 1, 2]  # nobody started twice
    assert len(groups) == 1
    assert [r.removed for r in groups[0].resizes] == [[2]]  # vacated, never re-numbered
    assert "restarting" not in states
    assert "resizing" not in states
    assert result.metrics["step"] == 59


def test_room_coming_back_refills_the_vacant_rank_while_the_others_train(tmp_path: Path) -> None:
    STARTS.clear()

    def script(group: Any) -> None:
        group.after_reports(9, lambda g: g.kill_worker(1))
        group.after_reports(60, lambda g: setattr(g, "free_workers", 1))

    result, groups, states = _fit(tmp_path, script, n=120, failure_config=FAILURES)
    assert sorted(r for r, _ in STARTS) == [0, 1, 1, 2]  # only rank 1 again, as a joiner
    (group,) = groups
    assert [(r.removed, r.added) for r in group.resizes] == [([1], []), ([], [1])]
    assert "restarting" not in states
    assert "resizing" not in states
    assert result.metrics["step"] == 119


def test_a_preempted_rank_moves_at_once_without_a_checkpoint(tmp_path: Path) -> None:
    STARTS.clear()

    def script(group: Any) -> None:
        group.free_workers = 1  # room elsewhere
        group.after_reports(9, lambda g: g.preempt_workers([0], reason="node draining"))

    result, groups, states = _fit(tmp_path, script)  # max_failures=0, no checkpoints at all
    assert sorted(r for r, _ in STARTS) == [0, 0, 1, 2]
    (group,) = groups
    assert [r.added for r in group.resizes] == [[0]]
    assert group.preemption_info() is None
    assert "resizing" not in states
    assert "restarting" not in states
    assert result.metrics["step"] == 59


def test_an_elastic_run_that_starts_small_grows_by_a_joining_rank(tmp_path: Path) -> None:
    STARTS.clear()
    grow = threading.Event()

    def script(group: Any) -> None:
        group.after_reports(9, lambda g: (setattr(g, "free_workers", 1), grow.set()))

    result, groups, states = _fit(tmp_path, script, n=120, fit=2)
    assert grow.is_set()
    assert sorted(r for r, _ in STARTS) == [0, 1, 2]  # rank 2 is new; 0 and 1 never restart
    (group,) = groups
    assert [r.added for r in group.resizes] == [[2]]
    assert "resizing" not in states
    assert result.metrics["step"] == 119


def test_a_fixed_size_group_moves_a_preempted_rank_the_same_way(tmp_path: Path) -> None:
    STARTS.clear()

    def script(group: Any) -> None:
        group.free_workers = 1  # room elsewhere (a fake group counts it whatever its size)
        group.after_reports(9, lambda g: g.preempt_workers([1], reason="SIGTERM"))

    cluster = FakeCluster([script])
    trainer = _PeerTrainer(
        _stepping,
        train_loop_config={"n": 60},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "fixed-peers"),
        _group_factory=cluster.start,
    )
    result = trainer.fit()
    assert sorted(r for r, _ in STARTS) == [0, 1, 1]
    assert len(cluster.groups) == 1  # not a new group, no restart from a checkpoint
    assert [r.added for r in cluster.groups[0].resizes] == [[1]]
    assert trainer._last_controller is not None
    states = [s.name for s in trainer._last_controller.history]
    assert "resizing" not in states
    assert "restarting" not in states
    assert result.metrics["step"] == 59


def test_a_preempted_rank_lost_before_it_could_move_uses_the_preemption_budget(
    tmp_path: Path,
) -> None:
    def script(group: Any) -> None:  # no room elsewhere: the rank cannot move in time
        group.after_reports(6, lambda g: g.preempt_workers([1], reason="node draining"))
        group.after_reports(9, lambda g: g.kill_worker(1))

    clusters: list[FakeCluster] = []

    def fit(path: Path, **failure: Any) -> Any:
        STARTS.clear()
        clusters.append(cluster := FakeCluster([script]))
        trainer = _PeerTrainer(
            _stepping,
            train_loop_config={"n": 60},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(path, "budget", failure_config=train.FailureConfig(**failure)),
            _group_factory=cluster.start,
        )
        return trainer.fit()

    result = fit(tmp_path / "a")  # max_failures=0: the loss is a preemption's
    story = [(g.replaced, g.resizes, g.leaked_threads) for g in clusters[0].groups], STARTS
    assert sorted(r for r, _ in STARTS) == [0, 1, 1], story
    assert result.metrics["step"] == 59
    with pytest.raises(train.TrainingFailedError, match="max_preemption_failures=0"):
        fit(tmp_path / "b", max_preemption_failures=0)


def _barrier_first(config: dict[str, Any]) -> None:
    """As ``prepare_torchft``: the ranks of a launch meet in a barrier; a rank launched
    alone into the running attempt (it moved) does not."""
    from lumos.runtime import worker

    rank = train.get_context().get_world_rank()
    again = any(r == rank for r, _ in STARTS)
    _started(rank)
    session = worker.get_session()
    assert session is not None
    if not again:
        if rank == 1:  # moved before it gets there
            session.stop_event.wait(1.0)
            session.raise_if_stop_requested()
        session.barrier()
    for step in range(config["n"]):
        train.report({"step": step})
        time.sleep(0.003)


def test_a_rank_that_moves_before_the_launch_barrier_does_not_hold_the_others(
    tmp_path: Path,
) -> None:
    STARTS.clear()

    def script(group: Any) -> None:
        group.free_workers = 1
        group.preempt_workers([1], reason="SIGTERM")

    trainer = _PeerTrainer(
        _barrier_first,
        train_loop_config={"n": 30},
        scaling_config=train.ScalingConfig(num_workers=3),
        run_config=run_config(tmp_path, "barrier"),
        _group_factory=FakeCluster([script]).start,
    )
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(trainer.fit()), daemon=True)
    thread.start()
    thread.join(60)
    assert done, f"fit() still waits: started {STARTS}"
    assert sorted(r for r, _ in STARTS) == [0, 1, 1, 2]
    assert done[0].metrics["step"] == 29


def test_a_move_whose_new_worker_fails_to_start_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    STARTS.clear()

    def script(group: Any) -> None:
        group.free_workers = 1
        group.failing_starts = 1
        group.after_reports(9, lambda g: g.preempt_workers([0], reason="node draining"))

    caplog.set_level("DEBUG", logger="lumos.train")
    result, _groups, states = _fit(tmp_path, script)
    assert "did not start (WorkerGroupStartError" in caplog.text
    assert sorted(r for r, _ in STARTS) == [0, 0, 1, 2]  # moved on the second try
    assert "restarting" not in states
    assert result.metrics["step"] == 59
