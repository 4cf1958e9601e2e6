"""The `lumos` command on a real TorchTrainer run: 2 workers, a worker killed, resumed.

The installed console script is run as a user runs it, against the run's directory
and its storage path: `ls`, `show`, `--json`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import workloads

from lumos import train
from lumos.train.torch import TorchTrainer

STEPS = 3
CRASH_AT = 2


def lumos(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lumos")
    assert script.exists(), "reinstall lumos-storage: pip install -e packages/storage"
    return subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_lumos_show_and_ls_on_a_torch_trainer_run(ray_cluster: str, storage_dir: str) -> None:
    result = TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"x": 1.0, "steps": STEPS, "crash_at": CRASH_AT},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="cli-run",
            storage_path=storage_dir,
            failure_config=train.FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.metrics["step"] == STEPS

    shown = lumos("show", result.path, "--json")
    assert shown.returncode == 0, shown.stderr
    detail: dict[str, Any] = json.loads(shown.stdout)
    assert detail["kind"] == "run"
    assert detail["status"] == "finished"
    assert [a["status"] for a in detail["attempts"]] == ["errored", "finished"]
    (failure,) = detail["failures"]
    assert failure["error"]  # what ended attempt 0: rank 1's process exited
    names = [c["dir_name"] for c in detail["checkpoints"]]
    assert names == [f"step={s}" for s in range(1, STEPS + 1)]
    assert {c["status"] for c in detail["checkpoints"]} == {"committed"}
    assert detail["latest_checkpoint"] == f"step={STEPS}"
    assert detail["latest_metrics"]["step"] == STEPS
    assert detail["latest_metrics"]["resumed_from"] == CRASH_AT

    text = lumos("show", result.path)
    assert text.returncode == 0, text.stderr
    assert f"step={STEPS} (latest)" in text.stdout
    assert "errored" in text.stdout

    listed = lumos("ls", storage_dir, "--json", "--metric", "loss", "--mode", "min")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["name"], row["kind"], row["status"], row["attempts"]) == (
        "cli-run",
        "run",
        "finished",
        2,
    )
    assert row["best"]["metric"] == "loss"
    assert row["best"]["value"] == min((1.0 - 1.5) ** 2 + 1.0 / s for s in range(1, STEPS + 1))

    not_a_run = lumos("show", storage_dir)
    assert not_a_run.returncode == 2
    assert "is not a lumos run or sweep" in not_a_run.stderr
