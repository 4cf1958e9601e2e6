"""The soak's fault schedule is a function of the seed alone (so ``--seed`` reproduces it),
draws every kind (the new ones included), and ``--seeds`` draws fresh seeds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak

NEW_KINDS = {
    "driver_kill_after_training",
    "driver_kill_in_validation",
    "driver_kill_in_final_write",
    "s3_restart_in_multipart",
    "driver_stall_past_lease",
    "disk_full",
}


@pytest.fixture(autouse=True)
def _mountable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The schedule does not depend on this machine: say a tmpfs can be mounted (disk_full).
    monkeypatch.setattr(soak, "_can_mount", lambda: True)


def _harness(seed: int, tmp_path: Path, storage: str = "both") -> soak.Harness:
    args = argparse.Namespace(
        minutes=10.0, seed=seed, storage=storage, sweep=True, workdir=str(tmp_path / str(seed))
    )
    return soak.Harness(args)


def _plan(seed: int, tmp_path: Path, minutes: float = 10.0) -> list[tuple[float, str, int]]:
    return _harness(seed, tmp_path).plan_faults(0.0, minutes * 60.0)


def test_a_seed_gives_the_same_schedule_and_another_seed_another(tmp_path: Path) -> None:
    first = _plan(7, tmp_path)
    assert first == _plan(7, tmp_path / "again")
    assert first != _plan(8, tmp_path)
    offsets = [t for t, _, _ in first]
    assert offsets == sorted(offsets)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert all(soak.FAULT_GAP_S[0] <= g <= soak.FAULT_GAP_S[1] for g in gaps)


def test_every_kind_comes_once_in_each_round_of_kinds(tmp_path: Path) -> None:
    harness = _harness(7, tmp_path)
    assert set(harness.kinds) == set(soak.ALL_KINDS)
    assert set(harness.kinds) >= NEW_KINDS
    plan = harness.plan_faults(0.0, 600.0)
    kinds = [kind for _, kind, _ in plan]
    n = len(harness.kinds)
    assert len(kinds) >= 2 * n  # ten minutes: over two rounds of every kind
    for start in range(0, len(kinds) - n + 1, n):
        assert sorted(kinds[start : start + n]) == sorted(harness.kinds), start
    # Three minutes (the README's short soak) already draw most kinds, the new ones among them.
    short = {kind for _, kind, _ in _harness(7, tmp_path / "short").plan_faults(0.0, 144.0)}
    assert len(short) >= 10


def test_local_storage_alone_has_no_s3_faults(tmp_path: Path) -> None:
    kinds = {kind for _, kind, _ in _harness(1, tmp_path, "local").plan_faults(0.0, 600.0)}
    assert not kinds & {"s3_restart", "storage_errors", "s3_restart_in_multipart"}
    assert "disk_full" in kinds


def test_s3_alone_has_no_full_local_disk(tmp_path: Path) -> None:
    kinds = {kind for _, kind, _ in _harness(1, tmp_path, "s3").plan_faults(0.0, 600.0)}
    assert "disk_full" not in kinds
    assert {"s3_restart_in_multipart", "driver_stall_past_lease"} <= kinds


def test_no_mount_no_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak, "_can_mount", lambda: False)
    assert "disk_full" not in _harness(1, tmp_path).kinds


def test_fresh_seeds_are_new_and_never_the_built_in_ones() -> None:
    seen: set[int] = set()
    for _ in range(200):
        seed = soak.fresh_seed(seen)
        assert seed not in seen
        assert seed not in soak.BUILT_IN_SEEDS
        assert 0 <= seed < 1 << 31
        seen.add(seed)


def test_seed_and_seeds_are_exclusive_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.parse_args(["--minutes", "3", "--seed", "5"]).seed == 5
    assert soak.parse_args(["--minutes", "3", "--seeds", "2"]).seeds == 2
    for argv in (
        ["--minutes", "3"],
        ["--minutes", "3", "--seed", "5", "--seeds", "2"],
        ["--minutes", "3", "--seeds", "0"],
        ["--minutes", "0", "--seed", "5"],
    ):
        with pytest.raises(SystemExit):
            soak.parse_args(argv)
    assert "--seeds must be at least 1, got 0" in capsys.readouterr().err


def test_the_rerun_command_names_the_seed_and_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(soak, "torchft_installed", lambda: True)
    args = soak.parse_args(["--minutes", "5", "--seeds", "2", "--storage", "s3", "--no-sweep"])
    command = soak.rerun_command(args, 123)
    assert command.endswith("soak.py --minutes 5 --seed 123 --storage s3 --no-sweep")


def test_without_torchft_the_soak_and_its_rerun_leave_the_torchft_run_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(soak, "torchft_installed", lambda: False)
    args = soak.parse_args(["--minutes", "5", "--seed", "9"])
    assert args.torchft is False
    assert "torchft is not installed: no Train run with TorchftConfig" in capsys.readouterr().out
    assert soak.rerun_command(args, 9).endswith("soak.py --minutes 5 --seed 9 --no-torchft")


def test_seeds_run_one_soak_each_and_stop_at_the_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each seed is a soak.py subprocess of its own; here the children "exit" 0, then 1.
    children: list[list[str]] = []
    statuses = iter([0, 1, 0])

    def call(cmd: list[str]) -> int:
        children.append(cmd)
        return next(statuses)

    monkeypatch.setattr(soak.subprocess, "call", call)
    monkeypatch.setattr(soak, "torchft_installed", lambda: True)
    args = soak.parse_args(["--minutes", "2", "--seeds", "3", "--workdir", str(tmp_path)])
    assert soak.run_seeds(args) == 1
    assert len(children) == 2  # stopped at the failing second seed
    seeds = [int(cmd[cmd.index("--seed") + 1]) for cmd in children]
    assert len(set(seeds)) == 2
    assert not set(seeds) & soak.BUILT_IN_SEEDS
    for cmd, seed in zip(children, seeds, strict=True):
        assert cmd[cmd.index("--workdir") + 1] == str(tmp_path / f"seed-{seed}")
        assert cmd[cmd.index("--minutes") + 1] == "2"
    out = capsys.readouterr().out
    assert f"seed 1 of 3: {seeds[0]} (fresh: os.urandom and the clock)" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"seeds: seed {seeds[1]} failed (exit 1, run 2 of 3); rerun it: python ")
    assert last.endswith(f"soak.py --minutes 2 --seed {seeds[1]}")


def test_seeds_that_all_pass_say_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(soak.subprocess, "call", lambda cmd: 0)
    assert soak.run_seeds(soak.parse_args(["--minutes", "2", "--seeds", "2"])) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("seeds: all 2 passed (")
