"""Ray Train's own ``torch_linear_example`` (shipped in the ray wheel) runs under lumos
as ``lumos migrate`` rewrites it: a 2-worker DDP run with checkpoints, in the default
storage (``~/lumos_results``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ray

from lumos.storage.migrate import migrate_source

EXAMPLE = Path(ray.__file__).parent / "train" / "examples" / "pytorch" / "torch_linear_example.py"


def test_torch_linear_example_runs_migrated(tmp_path: Path) -> None:
    migrated = migrate_source(EXAMPLE.read_text())
    assert not migrated.warnings, migrated.warnings
    assert "from lumos.train.torch import TorchTrainer" in migrated.code
    script = tmp_path / EXAMPLE.name
    script.write_text(migrated.code)
    # Its own cluster (the script's ray.init(num_cpus=3)), not this session's.
    env = dict(os.environ, RAY_ADDRESS="local", HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run(
        [sys.executable, str(script), "--smoke-test"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "'loss':" in run.stdout  # the script prints result.metrics
    runs = [p for p in (tmp_path / "lumos_results").iterdir() if p.name.startswith("train-")]
    assert len(runs) == 1  # lumos ran it, under a unique default name
