"""The hang watchdog without Ray: the stack classification, the judge, and the
component through ``RunCore`` with a scripted probe and a fake clock."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lumos import train
from lumos.runtime import FailureKind, RemoteError
from lumos.storage import RunState, RunStorage
from lumos.train._internal import hang_sampler
from lumos.train._internal.console import Console
from lumos.train._internal.controller.components.hang_watchdog import HangWatchdog
from lumos.train._internal.controller.core import RunCore
from lumos.train._internal.controller.hang_judge import HangJudge
from lumos.train._internal.controller.seam import RanksStuck
from lumos.train._internal.controller.spec import RunSpec
from lumos.train._internal.hang_sampler import Position, Sample, classify

LIB = ("/site/torch/", "/site/lumos/")
USER = ("/home/me/train.py", 42, "train_func")
SESSION = ("/site/lumos/train/_internal/session.py", 90, "run_in_session")
ALL_REDUCE = [
    ("/site/torch/distributed/c10d_logger.py", 81, "wrapper"),
    ("/site/torch/distributed/distributed_c10d.py", 2806, "all_reduce"),
]


def test_classify_finds_the_collective_the_user_frame_and_expected_waits() -> None:
    pos = classify([SESSION, USER, *ALL_REDUCE], LIB)
    assert pos == Position("/home/me/train.py:42 in train_func", "all_reduce", None)
    sleeping = classify([SESSION, USER], LIB)
    assert (sleeping.collective, sleeping.exempt) == (None, None)
    report = ("/site/lumos/train/_internal/reporting.py", 251, "_wait_committed")
    assert classify([SESSION, USER, report], LIB).exempt == "in train.report"
    save = ("/site/torch/serialization.py", 900, "_save")
    assert classify([SESSION, USER, save], LIB).exempt == "in torch.save / torch.load"
    ddp = ("/site/torch/nn/parallel/distributed.py", 1600, "forward")
    assert classify([SESSION, USER, ddp], LIB).collective == "DistributedDataParallel.forward"


def test_a_checkpoint_download_on_resume_is_an_expected_wait() -> None:
    # a soak seed on a loaded machine: rank 1 sat > hang_timeout_s in
    # train.get_checkpoint().as_directory() while S3 restarted; the watchdog fired on it
    download = [
        ("/site/lumos/storage/_internal/checkpoint.py", 140, "as_directory"),
        ("/site/lumos/storage/_internal/filesystem.py", 350, "download_dir"),
        ("/usr/lib/python3.11/concurrent/futures/_base.py", 451, "result"),
        ("/usr/lib/python3.11/threading.py", 327, "wait"),
    ]
    pos = classify([SESSION, USER, *download], (*LIB, "/usr/lib/python3.11/"))
    assert pos.exempt == "in lumos.storage (a checkpoint download or storage call)"
    assert pos.where == "/home/me/train.py:42 in train_func"


def test_a_replacement_joining_torchfts_quorum_is_an_expected_wait() -> None:
    # bench_goodput --torchft on a loaded machine: the replacement of a SIGKILLed rank
    # sat > hang_timeout_s in torchft's quorum while it took its peer's state, and the
    # watchdog restarted every rank; torchft's own timeout bounds the wait
    quorum = [
        ("/site/torchft/optim.py", 50, "zero_grad"),
        ("/site/torchft/manager.py", 627, "wait_quorum"),
        ("/usr/lib/python3.11/concurrent/futures/_base.py", 451, "result"),
    ]
    pos = classify([SESSION, USER, *quorum], (*LIB, "/site/torchft/", "/usr/lib/python3.11/"))
    assert pos.exempt == "in torchft (a quorum, a peer's state or a collective)"
    assert pos.where == "/home/me/train.py:42 in train_func"


def test_a_rank_in_the_launch_barrier_waits_for_the_others_under_peer_recovery() -> None:
    # nox's sessions two at a time (load 11): under TorchftConfig rank 0 sat > 3 s in
    # prepare_torchft's launch barrier (lumos.runtime's, not torch.distributed's) while its
    # peers still imported torchft; per rank, that wait was nobody's and rank 0 was
    # named stuck and replaced before its first step
    barrier = [
        ("/site/lumos/train/_internal/torch/torchft_loop.py", 254, "prepare_torchft"),
        ("/site/lumos/runtime/_internal/session.py", 207, "barrier"),
        ("/site/lumos/runtime/_internal/session.py", 260, "_wait_control"),
    ]
    pos = classify([SESSION, USER, *barrier], LIB)
    assert pos.collective == "lumos barrier"
    assert pos.where == "/home/me/train.py:42 in train_func"
    judge = HangJudge(3, timeout_s=3, per_rank=True)
    importing = "importing"
    for t in range(0, 20):
        judge.observe(0, _s(1, collective=pos.collective), t)  # in the barrier throughout
        judge.observe(1, _s(1, exempt=importing) if t < 15 else _s(1, where="train.py:9"), t)
        judge.observe(2, _s(1, exempt=importing), t)
        found = judge.stuck(t)
        assert (found is not None) is (t >= 17), (t, found)
    assert found is not None
    assert found.stuck == (1,)  # out of its imports, rank 1 stands still outside any wait
    assert found.culprits == (1,)


def test_sample_sees_a_thread_move_and_stop() -> None:
    go, stop = threading.Event(), threading.Event()
    reports = [0]

    def spin() -> None:
        go.wait()
        while not stop.is_set():
            reports[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    assert thread.ident is not None
    hang_sampler.watch(thread.ident, lambda: reports[0])
    try:
        hang_sampler.enter_user()
        first = hang_sampler.sample()
        assert first is not None
        assert first.phase == "user"
        assert "spin" in hang_sampler.all_stacks()
    finally:
        go.set()
        stop.set()
        thread.join()
        hang_sampler.unwatch(thread.ident)
    assert hang_sampler.sample() is None


def _s(moves: int, reports: int = 1, collective: str | None = None, **kw: Any) -> Sample:
    where = kw.pop("where", "train.py:1 in f")
    return Sample(
        kw.pop("phase", "user"), moves, reports, Position(where, collective, kw.pop("exempt", None))
    )


def test_judge_names_the_rank_outside_the_collective() -> None:
    judge = HangJudge(3, timeout_s=10)
    for t in range(0, 30):
        judge.observe(0, _s(1, collective="all_reduce"), t)
        judge.observe(1, _s(t, where="train.py:7 in f"), t)  # endless loop: moving
        judge.observe(2, _s(1, collective="all_reduce"), t)
        finding = judge.stuck(t)
        if t < 10:
            assert finding is None
    assert finding is not None
    assert finding.culprits == (1,)
    assert finding.stuck == (0, 2)
    assert "all_reduce" in finding.why[1]
    assert finding.where[1] == "train.py:7 in f"


def test_judge_waits_for_every_rank_and_for_expected_waits() -> None:
    judge = HangJudge(2, timeout_s=5)
    judge.observe(0, _s(1), 0)
    assert judge.stuck(100) is None  # rank 1 has not started: a group waiting for resources
    judge.observe(1, _s(1, phase="setup"), 100)
    assert judge.stuck(200) is None  # set-up (imports, the process group) never counts
    judge.observe(1, _s(2), 200)
    for t in range(200, 260):  # rank 0 uploads a checkpoint for a minute, rank 1 waits
        judge.observe(0, _s(1, exempt="uploading a checkpoint"), t)
        judge.observe(1, _s(2, collective="barrier"), t)
        assert judge.stuck(t) is None
    judge.observe(0, _s(2), 260)
    assert judge.stuck(263) is None  # the last expected wait was at 259
    found = judge.stuck(264)
    assert found is not None
    assert found.culprits == (0,)


def test_judge_names_a_stuck_rank_outside_before_the_waiting_ones_are_stuck() -> None:
    judge = HangJudge(3, timeout_s=10)
    judge.observe(0, _s(1, where="t.py:3 in f"), 0)  # stopped first (a deadlock)
    for t in range(0, 11):
        judge.observe(1, _s(1 + min(t, 5), collective="all_reduce"), t)  # entered it later
        judge.observe(2, _s(t), t)  # healthy, outside, moving
    found = judge.stuck(10)
    assert found is not None
    assert found.stuck == (0,)
    assert found.culprits == (0,)
    assert found.why[0] == "not inside a collective while rank(s) [1] wait in all_reduce"


def test_judge_blames_the_rank_behind_when_all_wait_in_collectives() -> None:
    judge = HangJudge(2, timeout_s=1)
    judge.observe(0, _s(1, reports=4, collective="all_reduce"), 0)
    judge.observe(1, _s(1, reports=3, collective="broadcast"), 0)
    found = judge.stuck(2)
    assert found is not None
    assert found.culprits == (1,)
    assert found.why[1] == "report index 3 behind 4"


def test_a_moving_rank_with_reports_is_never_stuck() -> None:
    judge = HangJudge(1, timeout_s=1)
    for t in range(100):
        judge.observe(0, _s(t % 2, reports=t // 3), t * 0.5)
        assert judge.stuck(t * 0.5) is None


def test_under_peer_recovery_a_wait_pauses_only_the_waiting_ranks_clock() -> None:
    """TorchftConfig: rank 1 sleeps in user code while rank 0 waits in torchft's quorum
    for it (an expected wait). Without ``per_rank`` nobody's clock would ever run."""
    torchft = "in torchft (a quorum, a peer's state or a collective)"
    found = None
    for per_rank, fired in ((False, False), (True, True)):
        judge = HangJudge(2, timeout_s=5, per_rank=per_rank)
        found = None
        for t in range(0, 30):
            judge.observe(0, _s(1, exempt=torchft), t)
            judge.observe(1, _s(1, where="train.py:9 in f"), t)
            found = found or judge.stuck(t)
        assert (found is not None) is fired
    assert found is not None
    assert found.stuck == (1,)  # rank 0 waits: its own clock is paused
    assert found.culprits == (1,)
    assert found.why[1] == "not inside a collective while rank(s) [0] wait in an expected wait"


def test_under_peer_recovery_a_joining_rank_never_holds_the_others_clock() -> None:
    judge = HangJudge(3, timeout_s=5, per_rank=True)
    for t in range(0, 12):
        judge.observe(0, _s(1), t)  # stuck in user code from the start
        judge.observe(1, _s(t), t)  # trains on
        judge.observe(2, _s(1, phase="setup") if t >= 2 else _s(t), t)  # replaced at 2
    assert judge.stuck(3) is None
    found = judge.stuck(11)
    assert found is not None
    assert found.stuck == (0,)


class ScriptedProbe:
    """Answers every poll with ``samples`` (a dict the test edits)."""

    def __init__(self) -> None:
        self.samples: dict[int, Sample] = {}
        self.resets = 0

    def poll(self) -> dict[int, Sample]:
        return dict(self.samples)

    def stacks(self, timeout_s: float) -> dict[int, str]:
        return {rank: f"stack of rank {rank}\n" for rank in self.samples}

    def reset(self) -> None:
        self.resets += 1


def _watchdog_core(tmp_path: Path) -> tuple[RunCore, HangWatchdog, ScriptedProbe, list[float]]:
    storage = RunStorage(str(tmp_path), "run")
    state = RunState(name="run")
    storage.save_state(state)
    spec = RunSpec(
        train_fn=lambda: None,
        config=None,
        pass_config=False,
        storage=storage,
        worker_storage=(str(tmp_path), None),
        console=Console(0),
    )
    now = [0.0]
    probe = ScriptedProbe()
    dog = HangWatchdog(
        storage, spec.console, probe, 5.0, lambda r: f"node{r}", interval_s=0.0,
        clock=lambda: now[0],
    )  # fmt: skip
    return RunCore(spec, state, lambda m: None, extra=(dog,)), dog, probe, now


def test_the_component_fires_once_writes_stacks_and_names_the_culprit(tmp_path: Path) -> None:
    core, _dog, probe, now = _watchdog_core(tmp_path)
    core.start()
    core.begin_attempt(0, 2, None)
    probe.samples = {0: _s(1, collective="all_reduce"), 1: _s(1, where="t.py:9 in f")}
    verdict = None
    while verdict is None and now[0] < 20:
        now[0] += 0.5
        verdict = core.idle(0.0)
    assert isinstance(verdict, RanksStuck)
    assert 5.0 <= now[0] <= 6.0
    (failure,) = verdict.failures
    assert (failure.rank, failure.kind, failure.node_id) == (1, FailureKind.HUNG, "node1")
    assert isinstance(failure.error, RemoteError)
    assert failure.error.traceback == "stack of rank 1\n"
    cause = failure.error.cause
    assert isinstance(cause, train.RankStuckError)
    assert (cause.rank, cause.node_id, cause.where, cause.culprits) == (
        1,
        "node1",
        "t.py:9 in f",
        (1,),
    )
    folder = tmp_path / "run" / "_lumos" / "hangs" / "attempt-0"
    assert cause.stacks_path.endswith("_lumos/hangs/attempt-0")
    assert (folder / "rank-0.txt").read_text() == "stack of rank 0\n"
    summary = json.loads((folder / "hang.json").read_text())
    assert summary["culprits"] == [1]
    assert summary["nodes"]["1"] == "node1"
    assert core.idle(0.0) is None  # once per attempt
    core.begin_attempt(1, 2, None)  # the next attempt starts a fresh judge
    assert core.idle(0.0) is None


def test_under_peer_recovery_the_component_judges_the_same_attempt_again(
    tmp_path: Path,
) -> None:
    """The stuck rank is replaced and the others go on: a later stall in the same attempt
    is found too."""
    core, dog, probe, now = _watchdog_core(tmp_path)
    dog._peers = True
    core.start()
    core.begin_attempt(0, 2, None)
    for round_ in range(2):
        probe.samples = {0: _s(round_, collective="all_reduce"), 1: _s(round_, where="t.py:9")}
        verdict = None
        started = now[0]
        while verdict is None and now[0] < started + 20:
            now[0] += 0.5
            verdict = core.idle(0.0)
        assert isinstance(verdict, RanksStuck), round_
        probe.samples = {0: _s(10 + round_, phase="setup"), 1: _s(10 + round_, phase="setup")}
        core.idle(0.0)  # the replacement starts: the new judge waits for it


def test_hang_timeout_is_validated() -> None:
    assert train.FailureConfig().hang_timeout_s == 600.0
    assert train.FailureConfig(hang_timeout_s=None).hang_timeout_s is None
    with pytest.raises(ValueError, match="hang_timeout_s=-1 is invalid"):
        train.FailureConfig(hang_timeout_s=-1)


def test_the_restart_avoids_the_culprits_node_where_the_cluster_has_another() -> None:
    from lumos.runtime import WorkerGroupSpec
    from lumos.runtime._internal.placement import avoid_nodes_selector
    from lumos.train._internal.controller.group import GroupDriver

    assert avoid_nodes_selector(("n1",), 2, ["n1", "n2"]) == [{"ray.io/node-id": "!in(n1)"}] * 2
    assert avoid_nodes_selector(("n1",), 2, ["n1"]) is None  # no other node: ignored
    assert avoid_nodes_selector((), 2, ["n1", "n2"]) is None
    started: list[WorkerGroupSpec] = []

    class Group:
        workers: list[Any] = []

        def shutdown(self, grace_period_s: float = 0.0) -> None:
            pass

    def factory(spec: WorkerGroupSpec, on_waiting: Any = None) -> Any:
        started.append(spec)
        return Group()

    driver = GroupDriver(factory, Console(0), shutdown_grace_s=0.0, stop_grace_s=0.0)
    driver.avoid_next({"n1"})
    driver.start(WorkerGroupSpec(num_workers=2))
    driver.start(WorkerGroupSpec(num_workers=2))  # only the restart right after the hang
    assert [s.avoid_nodes for s in started] == [("n1",), ()]


def test_the_component_asks_to_avoid_the_culprits_node_when_switched_on(tmp_path: Path) -> None:
    core, dog, probe, now = _watchdog_core(tmp_path)
    avoided: list[set[str]] = []
    dog._avoid = avoided.append
    core.start()
    core.begin_attempt(0, 2, None)
    probe.samples = {0: _s(1, collective="barrier"), 1: _s(1)}
    while not avoided and now[0] < 20:
        now[0] += 1
        core.idle(0.0)
    assert avoided == [{"node1"}]


def test_a_rank_that_returned_is_not_judged(tmp_path: Path) -> None:
    core, _dog, probe, now = _watchdog_core(tmp_path)
    core.start()
    core.begin_attempt(0, 2, None)
    probe.samples = {0: _s(1), 1: _s(1)}
    now[0] += 1
    assert core.idle(0.0) is None  # both started
    core.on_rank_ended(0, returned=False)  # rank 0 is done (stopped: nothing to aggregate)
    del probe.samples[0]
    moves = 1
    while now[0] < 30:  # rank 1 works on (its stack moves) long after rank 0 ended
        now[0] += 1
        moves += 1
        probe.samples[1] = _s(moves)
        assert core.idle(0.0) is None


def test_a_rank_replaced_by_peer_recovery_is_not_judged_on_its_old_process(
    tmp_path: Path,
) -> None:
    """Its new process answers nothing until its function runs (a slow start on a loaded
    machine): the old process's last sample must not make it look stuck."""
    core, dog, probe, now = _watchdog_core(tmp_path)
    dog._peers = True
    core.start()
    core.begin_attempt(0, 2, None)
    torchft = "in torchft (a quorum, a peer's state or a collective)"
    for moves in range(4):  # both train
        probe.samples = {0: _s(moves, exempt=torchft), 1: _s(moves, where="t.py:9")}
        now[0] += 0.5
        assert core.idle(0.0) is None
    probe.samples = {1: _s(9, where="t.py:9")}  # its last answer, rank 0's is late
    now[0] += 0.5
    assert core.idle(0.0) is None
    now[0] += 10.0  # the driver starts its new process (seconds on a loaded machine)
    core.rank_replaced(1)
    probe.samples = {0: _s(9, exempt=torchft)}  # which answers nothing for a while
    for _ in range(40):
        now[0] += 0.5
        assert core.idle(0.0) is None


def test_time_the_driver_spent_elsewhere_is_no_ranks_stall(tmp_path: Path) -> None:
    """Under peer recovery the driver starts a worker for a moved rank (seconds) while the
    ranks train on; the samples it then reads were taken before that. A rank that trained
    the whole time is not stuck (bench_goodput --torchft named rank 0, in its step's
    sleep, stuck 5 s after a preemption notice while its peer waited in the quorum);
    a rank that then stays put for the timeout still is."""
    core, dog, probe, now = _watchdog_core(tmp_path)
    dog._peers = True
    core.start()
    core.begin_attempt(0, 2, None)
    waiting = _s(1, exempt="torchft", where="t.py:127 in loop")
    for step in range(1, 10):  # both train: rank 0 reports, rank 1 waits in the quorum
        now[0] += 0.5
        probe.samples = {0: _s(step, reports=step, where="t.py:147 in loop"), 1: waiting}
        assert core.idle(0.0) is None
    now[0] += 6.0  # the driver was away (> the 5 s timeout); the answers predate that
    assert core.idle(0.0) is None
    for _ in range(8):  # rank 0 trains on
        now[0] += 0.5
        step += 1
        probe.samples = {0: _s(step, reports=step, where="t.py:147 in loop"), 1: waiting}
        assert core.idle(0.0) is None
    verdict = None  # now rank 0 stops: found, the gap above counted for nobody
    stopped = now[0]
    while verdict is None and now[0] < stopped + 20:
        now[0] += 0.5
        verdict = core.idle(0.0)
    assert isinstance(verdict, RanksStuck)
    assert [f.rank for f in verdict.failures] == [0]
    assert 5.0 <= now[0] - stopped <= 6.0
