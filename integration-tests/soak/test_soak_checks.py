"""The soak's checks print PASS/FAIL with the run they concern and the evidence (no Ray).

Each test builds a run on local disk through lumos's public storage API, breaks it
on purpose (a lost checkpoint, a duplicated step, a driver that died, a full disk that
never said so, a stopped driver that went on after a takeover), and reads what the
check printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak
import soak_checks
from soak_config import Exit, Job

from lumos.storage import CheckpointRecord, RunState, RunStorage

STEPS = 6


def _run(tmp_path: Path, steps_in_history: list[int], kept: list[int]) -> RunStorage:
    """A finished run whose history holds ``steps_in_history`` and which keeps ``kept``."""
    import torch

    storage = RunStorage(str(tmp_path / "storage"), "run-x")
    for step in kept:
        d = Path(storage.checkpoint_path(f"step={step}"))
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"step": step}))
        for rank in (0, 1):
            torch.save({"step": step, "rank": rank, "w": torch.zeros(4)}, d / f"shard-{rank}.pt")
    records = [
        CheckpointRecord(
            dir_name=f"step={s}",
            report_index=s - 1,
            validation_status="validated" if s == STEPS else None,
        )
        for s in kept
    ]
    storage.save_state(
        RunState(
            name="run-x",
            status="finished",
            checkpoints=records,
            latest_checkpoint=f"step={kept[-1]}",
        )
    )
    rows = [{"step": s, "attempt": 0, "loss": 1.0 / s} for s in steps_in_history]
    if STEPS in steps_in_history:
        rows[steps_in_history.index(STEPS)].update(val_step=STEPS, val_shards=2)
    storage.append_metrics(rows, 0)
    return storage


def _ledger(committed: list[int]) -> list[dict[str, object]]:
    return [
        {
            "run": "run-x",
            "rank": 0,
            "step": s,
            "ckpt": f"step={s}",
            "mode": "sync",
            "attempt": 0,
            "pid": 4242,
            "seen": None,
            "t": time.time(),
            "job": "01000000",
        }
        for s in committed
    ]


def _verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL "))]


def test_a_healthy_run_passes_every_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _run(tmp_path, list(range(1, STEPS + 1)), kept=[2, 4, 6])
    c = soak_checks.Checker()
    c.train_run("run-x", storage, _ledger([2, 4, 6]), STEPS, final=True, keep=3)
    out = capsys.readouterr().out
    assert c.violations == [], out
    assert c.lost == 0, out
    verdicts = _verdicts(out)
    assert len(verdicts) == 7, out
    assert all(v.startswith("PASS run-x: ") for v in verdicts), out
    assert "PASS run-x: the validation of step=6 is recorded (validated)" in verdicts


def test_a_lost_checkpoint_names_itself_and_where_it_was_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # step=4 was committed (its SYNC report returned) but the state keeps only step=6 after it.
    storage = _run(tmp_path, list(range(1, STEPS + 1)), kept=[2, 6])
    c = soak_checks.Checker()
    c.train_run("run-x", storage, _ledger([2, 4, 6]), STEPS, final=True, keep=3)
    out = capsys.readouterr().out
    assert c.lost == 1
    assert "FAIL run-x: 3 committed checkpoints present or retired by retention" in out
    evidence = out.split("FAIL run-x: 3 committed", 1)[1].splitlines()[1]
    assert evidence.startswith(
        "    - step=4: committed (its SYNC report returned on rank 0, pid 4242"
    )
    assert f"expected at {storage.checkpoint_path('step=4')}" in evidence
    assert "only 1 newer checkpoint(s) kept, retention keeps 3" in evidence
    assert str(storage.state_path) in evidence
    assert c.violations[0].startswith(
        "run-x: 3 committed checkpoints present or retired by retention: step=4"
    )


def test_a_duplicated_step_shows_both_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _run(tmp_path, [1, 2, 3, 3, 4, 6], kept=[2, 4, 6])
    c = soak_checks.Checker()
    c.train_run("run-x", storage, _ledger([2, 4, 6]), STEPS, final=True, keep=3)
    out = capsys.readouterr().out
    assert "FAIL run-x: metrics history has every step once, in order" in out
    assert (
        "    - step 3 appears 2 times: row 2 {step: 3, attempt: 0, loss: 0.3333333333333333}, "
        "row 3 {step: 3, attempt: 0, loss: 0.3333333333333333}" in out
    )
    assert "    - steps missing: [5] (6 rows)" in out
    assert f"(history in {storage.uri}/_lumos/metrics)" in out
    assert len(c.violations) == 1, c.violations


def test_an_unfinished_run_says_its_status_and_attempts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _run(tmp_path, list(range(1, STEPS + 1)), kept=[2, 4, 6])
    state = storage.load_state()
    assert state is not None
    from lumos.storage import AttemptRecord

    storage.save_state(
        state.model_copy(
            update={
                "status": "errored",
                "attempts": [AttemptRecord(index=0, status="errored", error="boom on rank 1")],
            }
        )
    )
    c = soak_checks.Checker()
    c.train_run("run-x", storage, _ledger([2, 4, 6]), STEPS, final=True, keep=3)
    out = capsys.readouterr().out
    assert "FAIL run-x: finished at step 6" in out
    assert (
        f"    - status 'errored' in {storage.state_path}; last attempts: #0 errored (boom on rank 1)"
        in out
    )


def _job(tmp_path: Path, kind: str = "train") -> Job:
    job = Job(kind, "run-x", "local", {"loop": {"steps": STEPS}}, [], tmp_path / "logs" / "run-x")
    job.log_dir.mkdir(parents=True)
    return job


def test_a_driver_that_died_shows_its_status_log_path_and_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path)
    job.log_at(1).write_text("killed by the soak\n")
    job.log_at(2).write_text("\n".join(f"line {i}" for i in range(30)) + "\nValueError: bad\n")
    job.starts = 2
    job.exits = [
        Exit(1, -9, job.log_at(1), "killed by the soak"),
        Exit(2, 1, job.log_at(2), "unexpected"),
    ]
    c = soak_checks.Checker()
    soak_checks.driver_status(c, job)
    out = capsys.readouterr().out
    assert "FAIL run-x: driver ended with status 0" in out
    assert f"    - start 2 exited 1 (log {job.log_at(2)}); its last lines:" in out
    assert "      | ValueError: bad" in out
    assert "      | line 29" in out
    assert "line 10\n" not in out  # the tail only
    assert "no RESULT line" in out

    ok = _job(tmp_path / "ok")
    ok.log_at(1).write_text('RESULT {"metrics": {}}\n')
    ok.starts, ok.result = 1, {"metrics": {}}
    ok.exits = [Exit(1, 0, ok.log_at(1), "ok")]
    soak_checks.driver_status(c, ok)
    assert "PASS run-x: driver ended with status 0 (1 start(s))" in capsys.readouterr().out


def _full_disk_job(tmp_path: Path, log: str, rc: int | None) -> Job:
    job = _job(tmp_path)
    job.log_at(1).write_text(log)
    job.starts = 2
    job.disk_full = {
        "at": time.time(),
        "start": 1,
        "filled": 1,
        "free": 0,
        "outcome": {"rc": rc, "start": 1, "log": str(job.log_at(1))},
    }
    job.result = {"metrics": {}}
    return job


def test_a_full_disk_must_say_enospc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = soak_checks.Checker()
    silent = _full_disk_job(tmp_path / "a", "Traceback ...\nRuntimeError: something\n", rc=1)
    soak_checks.disk_full(c, silent)
    out = capsys.readouterr().out
    assert "FAIL run-x: a full disk failed the run with ENOSPC; the rerun finished" in out
    assert "never says ENOSPC or 'No space left'" in out
    assert "| RuntimeError: something" in out

    hung = _full_disk_job(tmp_path / "b", "still training\n", rc=None)
    soak_checks.disk_full(c, hung)
    assert "after its disk filled up" in capsys.readouterr().out

    said = "lumos.storage.StorageIOError: write failed: [Errno 28] No space left on device\n"
    soak_checks.disk_full(c, _full_disk_job(tmp_path / "c", said, rc=1))
    out = capsys.readouterr().out
    assert out.startswith("PASS run-x: a full disk failed the run with ENOSPC; the rerun finished")
    assert "No space left on device" in out
    assert len(c.violations) == 2


def test_a_stopped_driver_that_went_on_after_a_takeover_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path)
    job.log_at(1).write_text('DRIVER {"pid": 11, "ray_job": "01000000"}\nLost the lease\n')
    job.log_at(2).write_text('DRIVER {"pid": 22, "ray_job": "02000000"}\n')
    taken = time.time()
    job.takeover = {
        "stale_pid": 11,
        "stale_start": 1,
        "start": 2,
        "pid": 22,
        "at": taken,
        "stale_end": "exited 1",
    }
    ledger_dir = tmp_path / "harness"
    (ledger_dir / "ledger").mkdir(parents=True)
    records = [
        dict(rec, t=taken + (-5 if rec["step"] == 2 else 5), job="01000000")
        for rec in _ledger([2, 4])
    ]
    (ledger_dir / "ledger" / "run-x.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    harness = argparse.Namespace(ledger_dir=ledger_dir)
    c = soak_checks.Checker()
    soak_checks.lease_takeover(c, harness, job)
    out = capsys.readouterr().out
    assert "FAIL run-x: one driver at a time" in out
    assert "    - 1 report(s) of its workers returned after the takeover at" in out
    assert "by pid 22 (start 2): steps 4, checkpoints step=4 (every 2); the first at" in out
    assert "| Lost the lease" in out

    # Only reports from before the takeover: PASS.
    (ledger_dir / "ledger" / "run-x.jsonl").write_text(json.dumps(records[0]) + "\n")
    soak_checks.lease_takeover(c, harness, job)
    assert capsys.readouterr().out.startswith("PASS run-x: one driver at a time")
    assert len(c.violations) == 1


def test_the_report_ends_with_the_failures_the_state_the_rerun_and_the_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(soak, "_can_mount", lambda: False)
    monkeypatch.setattr(soak, "torchft_installed", lambda: True)
    args = soak.parse_args(["--minutes", "3", "--seed", "77", "--workdir", str(tmp_path / "w")])
    harness = soak.Harness(args)
    harness.faults.update({"worker_kill": 2, "disk_full": 1})
    harness.violations = ["run-x: finished at step 40: status 'errored'"]
    assert harness.report() == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        "faults injected: 3 (disk_full 1, worker_kill 2) · runs resumed: 0 · "
        "committed checkpoints lost: 0 · invariant violations: 1"
    )
    assert lines[-2].startswith("rerun this seed: python ")
    assert lines[-2].endswith("soak.py --minutes 3 --seed 77")
    assert lines[-3] == f"soak state: {tmp_path / 'w'}"
    assert "  FAIL run-x: finished at step 40: status 'errored'" in lines


def test_ranges_are_short() -> None:
    assert soak_checks.ranges([]) == "[]"
    assert soak_checks.ranges([4]) == "4"
    assert soak_checks.ranges(list(range(1, 41))) == "1..40"
    assert soak_checks.ranges(list(range(2, 41, 2)), 2) == "2..40"
    assert soak_checks.ranges(list(range(2, 41, 2))) == ", ".join(map(str, range(2, 41, 2)))
    assert soak_checks.ranges([1, 2, 3, 7, 9, 20]) == "1..3, 7, 9, 20"


def _stall_dirs(
    tmp_path: Path, stalls: list[dict[str, object]], rows: list[dict[str, object]]
) -> Path:
    (tmp_path / "stall").mkdir()
    (tmp_path / "ledger").mkdir()
    (tmp_path / "stall" / "started.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stalls))
    (tmp_path / "ledger" / "run-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_long_stall_the_watchdog_missed_fails_with_its_pid_and_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = 1_000_000.0
    long_s = soak_checks.HANG_TIMEOUT_S + 10.0
    stalls = [
        {"pid": 4242, "s": long_s, "where": "before_all_reduce", "t": t0},  # missed
        {"pid": 4343, "s": long_s, "where": "after_all_reduce", "t": t0},  # caught: pid gone
        {"pid": 4444, "s": 4.0, "where": "after_all_reduce", "t": t0},  # short: may go on
    ]
    rows = [
        {"run": "run-x", "rank": 1, "step": 9, "pid": 4242, "t": t0 + long_s + 20.0},
        {"run": "run-x", "rank": 0, "step": 3, "pid": 4343, "t": t0 - 1.0},
        {"run": "run-x", "rank": 0, "step": 4, "pid": 4444, "t": t0 + 30.0},
    ]
    c = soak_checks.Checker()
    soak_checks.stalls_caught(c, _stall_dirs(tmp_path, stalls, rows))
    out = capsys.readouterr().out
    assert _verdicts(out) == [
        "FAIL hang watchdog: every stall past hang_timeout_s stopped its rank"
    ]
    assert "pid 4242 (run-x, rank 1) stalled 40 s before_all_reduce" in out
    assert "still reported step 9" in out
    assert "4343" not in out
    assert "4444" not in out
    assert len(c.violations) == 1


def test_stalls_that_ended_their_attempt_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = 1_000_000.0
    stalls = [
        {"pid": 4242, "s": soak_checks.HANG_TIMEOUT_S + 10.0, "where": "before_all_reduce", "t": t0}
    ]
    rows = [{"run": "run-x", "rank": 1, "step": 9, "pid": 4242, "t": t0 - 0.5}]
    c = soak_checks.Checker()
    soak_checks.stalls_caught(c, _stall_dirs(tmp_path, stalls, rows))
    assert _verdicts(capsys.readouterr().out) == [
        "PASS hang watchdog: every stall past hang_timeout_s stopped its rank"
    ]
    assert not c.violations
