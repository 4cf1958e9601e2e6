"""The soak's fault schedule is a function of the seed alone (so ``--seed`` reproduces it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak


def _plan(seed: int, tmp_path: Path, minutes: float = 10.0) -> list[tuple[float, str, int]]:
    args = argparse.Namespace(
        minutes=minutes, seed=seed, storage="both", sweep=True, workdir=str(tmp_path / str(seed))
    )
    return soak.Harness(args).plan_faults(0.0, minutes * 60.0)


def test_a_seed_gives_the_same_schedule_and_another_seed_another(tmp_path: Path) -> None:
    first = _plan(7, tmp_path)
    assert first == _plan(7, tmp_path / "again")
    assert first != _plan(8, tmp_path)
    kinds = {kind for _, kind, _ in first}
    # Ten minutes draw every kind the harness can inject here.
    assert kinds == set(
        soak.Harness(
            argparse.Namespace(
                minutes=1, seed=0, storage="both", sweep=True, workdir=str(tmp_path / "k")
            )
        ).kinds
    )
    offsets = [t for t, _, _ in first]
    assert offsets == sorted(offsets)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert all(soak.FAULT_GAP_S[0] <= g <= soak.FAULT_GAP_S[1] for g in gaps)


def test_local_storage_alone_has_no_s3_faults(tmp_path: Path) -> None:
    args = argparse.Namespace(
        minutes=10, seed=1, storage="local", sweep=True, workdir=str(tmp_path)
    )
    kinds = {kind for _, kind, _ in soak.Harness(args).plan_faults(0.0, 600.0)}
    assert not kinds & {"s3_restart", "storage_errors"}
