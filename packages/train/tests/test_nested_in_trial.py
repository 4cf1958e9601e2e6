"""A Train run inside a Tune trial: what it hands to the trial through the JobContext.

Committed checkpoints go to ``report_checkpoint``; a rerun (a Tune retry) re-sends the
commits the trial missed; ``nested_run_name`` and ``starting_checkpoint`` start a fresh
run from a given checkpoint (population-based training). No Ray: ``FakeCluster``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import train_fns
from fake_runs import trial_context

from lumos import train
from lumos.runtime.context import JobContext, running
from lumos.runtime.testing import FakeCluster
from lumos.storage import LeaseHeldError, RunStorage


def _fit(ctx: JobContext, steps: int) -> train.Result:
    trainer = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": steps},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
        _group_factory=FakeCluster().start,
    )
    with running(ctx):
        return trainer.fit()


def _recording(tmp_path: Path) -> tuple[JobContext, list[tuple[int, str | None]]]:
    seen: list[tuple[int, str | None]] = []
    ctx = trial_context(tmp_path, lambda m: seen.append((m["step"], None)), threading.Event())
    ctx.report_checkpoint = lambda m, url: seen.append((m["step"], url))
    return ctx, seen


def test_commits_reach_the_trial_with_their_checkpoint(tmp_path: Path) -> None:
    ctx, seen = _recording(tmp_path)
    result = _fit(ctx, 3)
    run = RunStorage(tmp_path / "trial_0", "train")
    assert [s for s, _ in seen] == [0, 1, 2]
    assert [url for _, url in seen] == [run.checkpoint(f"checkpoint_{i}").uri for i in range(3)]
    assert result.checkpoint is not None
    assert result.checkpoint.uri == seen[-1][1]


def test_a_rerun_sends_the_commits_after_the_trials_checkpoint(tmp_path: Path) -> None:
    ctx, seen = _recording(tmp_path)
    _fit(ctx, 3)
    urls = [url for _, url in seen]

    for known, expected in ((urls[0], [1, 2]), (None, [0, 1, 2]), (urls[2], [])):
        again, resent = _recording(tmp_path)
        again.starting_checkpoint = known  # the trial's latest checkpoint, as Tune retries it
        _fit(again, 3)  # the run is finished: its stored result, after the catch-up
        assert [s for s, _ in resent] == expected
        assert [u for _, u in resent] == urls[3 - len(expected) :]


def test_a_fresh_nested_run_starts_from_the_parents_checkpoint(tmp_path: Path) -> None:
    clone = tmp_path / "trial_0" / "checkpoint_000004_from_00001"
    clone.mkdir(parents=True)
    (clone / "state.json").write_text(json.dumps({"step": 4}))
    ctx, seen = _recording(tmp_path)
    ctx.nested_run_name = "train-pbt1"
    ctx.starting_checkpoint = str(clone)
    _fit(ctx, 7)
    assert [s for s, _ in seen] == [5, 6]
    run = RunStorage(tmp_path / "trial_0", "train-pbt1")
    state = run.load_state()
    assert state is not None
    assert state.status == "finished"
    assert not os.path.exists(tmp_path / "trial_0" / "train")


def test_a_lease_the_trials_previous_driver_left_is_waited_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A resumed sweep reruns the trial while the Train run's lease, taken by the killed
    # sweep's trial actor, still runs out: the trial waits for the expiry, then resumes.
    ctx, _ = _recording(tmp_path)
    _fit(ctx, 2)
    run = RunStorage(tmp_path / "trial_0", "train")
    run.acquire_lease("lumos.train driver", ttl_s=1.5)  # never renewed, never released
    again, resent = _recording(tmp_path)
    _fit_verbose(again, 3)
    state = run.load_state()
    assert state is not None
    assert state.status == "finished"
    assert [s for s, _ in resent] == [0, 1]  # the stored result, after the catch-up
    captured = capsys.readouterr()
    assert "the trial's previous driver; waiting" in captured.err + captured.out


def test_a_lease_that_is_still_renewed_is_refused_after_the_waits(tmp_path: Path) -> None:
    run = RunStorage(tmp_path / "trial_0", "train")
    lease = run.acquire_lease("a live driver", ttl_s=0.6)
    lease.start_renewing(interval_s=0.1)
    try:
        ctx, _ = _recording(tmp_path)
        with pytest.raises(LeaseHeldError, match="a live driver"):
            _fit(ctx, 2)
    finally:
        lease.release()


def _fit_verbose(ctx: JobContext, steps: int) -> train.Result:
    trainer = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": steps},
        scaling_config=train.ScalingConfig(num_workers=2),
        _group_factory=FakeCluster().start,
    )
    with running(ctx):
        return trainer.fit()
