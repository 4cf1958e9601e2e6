"""The hang watchdog in local mode and under torchrun (no Ray): the store transport
with a real torch store, then a stalled run alone and a stalled rank under torchrun,
each named, its stacks written, the process exiting, and the rerun resuming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lumos.storage import RunState, RunStorage
from lumos.train._internal import hang_sampler
from lumos.train._internal.console import Console
from lumos.train._internal.controller.components.hang_watchdog import HangWatchdog
from lumos.train._internal.controller.core import RunCore
from lumos.train._internal.controller.seam import RanksStuck
from lumos.train._internal.controller.spec import RunSpec
from lumos.train._internal.hang_sampler import Position, Sample, classify
from lumos.train._internal.local_hang import HANG_EXIT_CODE, Publisher, StoreProbe

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "hang_local_script.py"


def _env() -> dict[str, str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _hang(storage: Path, name: str) -> dict[str, Any]:
    with open(storage / name / "_lumos" / "hangs" / "attempt-0" / "hang.json") as f:
        found: dict[str, Any] = json.load(f)
    return found


def _result(out: str) -> dict[str, Any]:
    # every rank prints its line; under torchrun two may share one line of the output
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    metrics, _ = json.JSONDecoder().raw_decode(line[len("RESULT ") :])
    assert isinstance(metrics, dict), line
    return metrics


LIB = ("/site/torch/", "/site/lumos/")
USER = ("/home/me/train.py", 42, "train_func")
REPORT = ("/site/lumos/train/_internal/reporting.py", 250, "report")


def test_waiting_for_the_other_ranks_in_train_report_is_a_collective_not_an_excuse() -> None:
    exchange = ("/site/lumos/train/_internal/local_exchange.py", 90, "gather")
    gather = ("/site/torch/distributed/distributed_c10d.py", 3000, "all_gather_object")
    waiting = classify([USER, REPORT, exchange, gather], LIB)
    assert waiting.collective == "all_gather_object"
    assert waiting.exempt is None  # the others may be stuck: it must not reset the clock
    assert classify([USER, REPORT], LIB).exempt == "in train.report"  # saving, uploading


def test_a_backward_under_a_process_group_waits_in_ddps_all_reduce() -> None:
    backward = ("/site/torch/autograd/graph.py", 829, "_engine_run_backward")
    assert classify([USER, backward], LIB).collective is None
    assert classify([USER, backward], LIB, distributed=True).collective == (
        "backward (DDP's gradient all-reduce)"
    )


def test_publisher_and_store_probe_carry_samples_and_stacks() -> None:
    import torch.distributed as dist

    store = dist.HashStore()
    stop = threading.Event()
    watched: list[int] = []

    def training() -> None:
        ident = threading.get_ident()
        hang_sampler.watch(ident, lambda: 7)
        hang_sampler.enter_user()
        watched.append(ident)
        stop.wait(30)

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    while not watched:
        time.sleep(0.01)
    probe = StoreProbe(store, world_size=2)
    assert probe.poll() == {}  # nobody published yet
    publisher = Publisher(store, 1, interval_s=0.02).start()
    try:
        deadline = time.monotonic() + 10
        samples: dict[int, Any] = {}
        while 1 not in samples and time.monotonic() < deadline:
            samples = probe.poll()
            time.sleep(0.02)
        assert samples[1].phase == "user"
        assert samples[1].reports == 7
        assert "test_hang_local.py" in samples[1].position.where
        assert probe.node_of(1) is not None
        stacks = probe.stacks(timeout_s=5.0)
        assert "training thread" in stacks[1]
        assert "stop.wait(30)" in stacks[1]
        assert stacks[0] == "(the rank did not answer in time)\n"  # rank 0 never published
    finally:
        publisher.stop()
        stop.set()
        hang_sampler.unwatch(watched[0])


def test_local_mode_names_the_stall_writes_stacks_exits_and_the_rerun_resumes(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "stalled"
    command = [sys.executable, str(SCRIPT), str(tmp_path), "alone", str(marker), "0"]
    first = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=240)
    out = first.stdout + first.stderr
    assert first.returncode == HANG_EXIT_CODE, out[-5000:]
    found = _hang(tmp_path, "alone")
    assert found["culprits"] == [0]
    assert "hang_local_script.py" in found["where"]["0"]
    assert "in loop" in found["where"]["0"]
    stacks = (tmp_path / "alone" / "_lumos" / "hangs" / "attempt-0" / "rank-0.txt").read_text()
    assert "time.sleep(3600)" in stacks
    assert "rank 0 on node" in out
    assert "stuck at" in out
    assert f"status {HANG_EXIT_CODE}" in out
    state = RunStorage(str(tmp_path), "alone").load_state()
    assert state is not None
    assert state.status == "errored"
    assert state.attempts[-1].status == "errored"
    assert "stuck at" in (state.attempts[-1].error or "")
    assert [c.dir_name for c in state.checkpoints] == ["step=0", "step=1"]

    second = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, (second.stdout + second.stderr)[-5000:]
    assert _result(second.stdout) == {"step": 3, "start": 2}  # resumed after step=1


def test_torchrun_names_the_stalled_rank_exits_and_the_rerun_resumes(tmp_path: Path) -> None:
    """Rank 1 sleeps before an all-reduce; rank 0's watchdog names it and exits, so
    torchrun stops rank 1. The same command again resumes (``--max-restarts`` would do
    that in one command, but torch's own restart of gloo ranks fails on this machine:
    its second round cannot connect its default process group, lumos or not)."""
    marker = tmp_path / "stalled"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(SCRIPT), str(tmp_path), "tr", str(marker), "1"]
    first = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    out = first.stdout + first.stderr
    assert first.returncode != 0, out[-6000:]
    assert f"exitcode  : {HANG_EXIT_CODE}" in out, out[-6000:]
    found = _hang(tmp_path, "tr")
    assert found["culprits"] == [1], found
    assert "not inside a collective" in found["why"]["1"]
    folder = tmp_path / "tr" / "_lumos" / "hangs" / "attempt-0"
    assert "time.sleep(3600)" in (folder / "rank-1.txt").read_text()
    assert "all_reduce" in (folder / "rank-0.txt").read_text()
    assert "rank 1 on node" in out
    assert "stuck at" in out

    second = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, (second.stdout + second.stderr)[-6000:]
    assert _result(second.stdout) == {"step": 3, "start": 2}
    state = RunStorage(str(tmp_path), "tr").load_state()
    assert state is not None
    assert state.status == "finished"


class _LateProbe:
    """Answers with ``samples``, except for the ranks in ``late`` (their answers lag)."""

    def __init__(self) -> None:
        self.samples: dict[int, Sample] = {}
        self.late: set[int] = set()

    def poll(self) -> dict[int, Sample]:
        return {r: s for r, s in self.samples.items() if r not in self.late}

    def stacks(self, timeout_s: float) -> dict[int, str]:
        return {r: f"stack {r}\n" for r in self.samples}

    def reset(self) -> None:
        pass


def _sample(
    moves: int, where: str, collective: str | None = None, exempt: str | None = None
) -> Sample:
    return Sample("user", moves, 0, Position(where, collective, exempt))


def test_the_watchdog_judges_only_once_every_rank_answered(tmp_path: Path) -> None:
    """A rank whose answers lag (a loaded machine) may be in an expected wait: the
    others' waiting for it is no hang until its answer says where it is."""
    storage = RunStorage(str(tmp_path), "run")
    state = RunState(name="run")
    storage.save_state(state)
    spec = RunSpec(
        train_fn=lambda: None, config=None, pass_config=False, storage=storage,
        worker_storage=(str(tmp_path), None), console=Console(0),
    )  # fmt: skip
    now = [0.0]
    probe = _LateProbe()
    dog = HangWatchdog(
        storage, spec.console, probe, 5.0, lambda r: "n", interval_s=0.0, clock=lambda: now[0]
    )
    core = RunCore(spec, state, lambda m: None, extra=(dog,))
    core.start()
    core.begin_attempt(0, 2, None)
    probe.samples = {0: _sample(1, "t.py:1 in f"), 1: _sample(1, "t.py:2 in f", "all_reduce")}
    now[0] += 0.5
    assert core.idle(0.0) is None  # both answered: armed
    probe.late = {0}  # rank 0 imports a big module; its answers lag for 12 s
    probe.samples[0] = _sample(2, "t.py:1 in f", exempt="importing")
    while now[0] < 12:
        now[0] += 0.5
        assert core.idle(0.0) is None  # rank 1 waits in its all-reduce, no progress
    probe.late = set()  # the answer: an import, which resets everyone's clock
    now[0] += 0.5
    assert core.idle(0.0) is None
    probe.samples[0] = _sample(3, "t.py:9 in f")  # now rank 0 stalls outside
    verdict = None
    start = now[0]
    while verdict is None and now[0] < 40:
        now[0] += 0.5
        verdict = core.idle(0.0)
    assert isinstance(verdict, RanksStuck)
    assert 5.0 <= now[0] - start <= 6.5
    assert [f.rank for f in verdict.failures] == [0]
