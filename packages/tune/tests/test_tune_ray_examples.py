"""Ray Tune's own example scripts (shipped in the ray wheel, no download) run under lumos
with only their imports rewritten from ``ray.tune`` to ``lumos.tune``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ray

EXAMPLES = Path(ray.__file__).parent / "tune" / "examples"

# ASHA + with_resources({"cpu": 1}) + RunConfig(stop); OptunaSearch(define-by-run) +
# ConcurrencyLimiter + ASHA; PBT over a function; PBT over a tune.Trainable class;
# a LoggerCallback with Ray's hook signature + name creators reading trial.trainable_name;
# the basic example; HyperBand over a function; checkpointing in a function.
SCRIPTS = [
    "async_hyperband_example",
    "optuna_define_by_run_example",
    "pbt_function",
    "pbt_example",
    "logging_example",
    "tune_basic_example",
    "hyperband_function_example",
    "custom_func_checkpointing",
]


def rewrite(source: str) -> str:
    """Only the imports change: ``ray.tune`` -> ``lumos.tune``."""
    source = re.sub(r"^from ray import tune$", "from lumos import tune", source, flags=re.M)
    return re.sub(r"^from ray\.tune", "from lumos.tune", source, flags=re.M)


@pytest.mark.parametrize("name", SCRIPTS)
def test_ray_example_runs_with_only_its_imports_changed(name: str, tmp_path: Any) -> None:
    source = (EXAMPLES / f"{name}.py").read_text()
    script = tmp_path / f"{name}.py"
    script.write_text(rewrite(source))
    assert "from ray import tune" not in script.read_text()
    # Its own cluster: a bare ray.init() would join any cluster running on the machine
    # (this session's, or another job's) and then reject the script's num_cpus.
    env = dict(os.environ, RAY_ADDRESS="local")
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run(
        [sys.executable, str(script), "--smoke-test"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Best hyperparameters" in run.stdout
    assert (tmp_path / "lumos_results").is_dir()  # lumos ran it, not Ray Tune
