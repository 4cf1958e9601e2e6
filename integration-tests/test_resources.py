"""More Train workers than the cluster has CPUs: trials wait for resources, no deadlock.

The 4-CPU cluster first has 3 CPUs taken by a placeholder placement group, so no
trial's 2-worker group fits: all three trials wait, and the console must say why.
Once the placeholder is gone, the runs get their workers as CPUs free up (a
trial's own actor reserves no CPU) and every trial finishes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import workloads
from it_helpers import assert_no_uncommitted
from ray.util.placement_group import placement_group, remove_placement_group

from lumos import train, tune
from lumos.train.torch import TorchTrainer

WAITING = "waiting for resources"


def _trial(config: dict[str, Any]) -> None:
    TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"x": config["x"], "steps": 3},
        scaling_config=train.ScalingConfig(num_workers=2),
    ).fit()


def test_trials_wait_for_train_workers_instead_of_deadlocking(
    ray_cluster: str, storage_dir: str, capfd: pytest.CaptureFixture[str]
) -> None:
    import ray

    placeholder = placement_group([{"CPU": 3}])
    ray.get(placeholder.ready(), timeout=60)
    tuner = tune.Tuner(
        _trial,
        param_space={"x": tune.uniform(0, 3)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=3,
            max_concurrent_trials=3,  # 3 trials x 2 workers > 4 CPUs
            trial_resources={"CPU": 0},
        ),
        run_config=tune.RunConfig(name="crowded", storage_path=storage_dir, verbose=0),
    )
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["grid"] = tuner.fit()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="tuner-fit", daemon=True)
    thread.start()
    output = ""
    try:
        # Worker output reaches this process through Ray's log monitor: poll what
        # arrived (bounded) for the line that says why the trials do not start.
        deadline = time.monotonic() + 30.0
        while WAITING not in output.lower() and time.monotonic() < deadline:
            time.sleep(0.5)
            output += "".join(capfd.readouterr())
    finally:
        remove_placement_group(placeholder)

    thread.join(240)
    assert not thread.is_alive(), "the sweep did not finish within 240 s: deadlocked?"
    assert "error" not in outcome, outcome.get("error")
    grid = outcome["grid"]
    assert [r.status for r in grid] == ["TERMINATED"] * 3, [r.error for r in grid]
    assert all(r.metrics["step"] == 3 for r in grid)
    assert_no_uncommitted(storage_dir, "crowded")
    assert WAITING in output.lower(), (
        "nothing on the console said why the trials' Train runs were not starting "
        f"(expected a line containing {WAITING!r}); output was:\n{output[-3000:]}"
    )
