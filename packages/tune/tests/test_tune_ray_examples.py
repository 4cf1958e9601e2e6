"""Ray Tune's own example scripts (shipped in the ray wheel, no download) run under lumos
as ``lumos migrate`` rewrites them (for most, only their imports change from ``ray.tune``
to ``lumos.tune``), one after the other in one HOME and the default storage."""

from __future__ import annotations

import json
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


# Scripts beyond the list above (their imports name more than ``ray.tune``: Optuna,
# ``ray.tune.utils.mock_trainable``): Optuna single and multi-objective, HyperBand over a
# class that shares its sweep name with hyperband_function_example.
MORE_SCRIPTS = ["optuna_example", "optuna_multiobjective_example", "hyperband_example"]

# As a user runs them: one after the other, one HOME, the default storage. Four of them
# name their sweep "hyperband_test", each another sweep (trainable or space; in this order).
IN_ORDER = [*MORE_SCRIPTS, *SCRIPTS]
SHARE_A_NAME = {
    "hyperband_example": "MyTrainableClass",
    "logging_example": "easy_objective",
    "hyperband_function_example": "train_func",
    "custom_func_checkpointing": "train_func",
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: Any) -> Path:
    return Path(tmp_path_factory.mktemp("home"))


@pytest.mark.parametrize("name", IN_ORDER)
def test_ray_example_runs_migrated_in_one_shared_home(name: str, home: Path) -> None:
    from lumos.storage.migrate import migrate_source

    source = (EXAMPLES / f"{name}.py").read_text()
    migrated = migrate_source(source)
    assert not migrated.warnings, migrated.warnings
    assert migrated.code == rewrite(source)  # only their imports change
    script = home / f"{name}.py"
    script.write_text(migrated.code)
    # Its own cluster: a bare ray.init() would join any cluster running on the machine
    # (this session's, or another job's) and then reject the script's num_cpus.
    env = dict(os.environ, RAY_ADDRESS="local", HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run(
        [sys.executable, str(script), "--smoke-test"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Best hyperparameters" in run.stdout
    assert (home / "lumos_results").is_dir()  # lumos ran it, not Ray Tune
    earlier = [n for n in IN_ORDER[: IN_ORDER.index(name)] if n in SHARE_A_NAME]
    if name in SHARE_A_NAME and earlier:  # another sweep took the name: this one runs beside
        said = " ".join(run.stdout.split())  # the console may wrap the line
        beside = f"hyperband_test-{len(earlier) + 1}"
        assert f"starting this one as '{beside}' beside it" in said, said[:3000]


def test_the_sweeps_sharing_a_name_were_kept_apart(home: Path) -> None:
    results = home / "lumos_results"
    stored = sorted(p.name for p in results.iterdir() if p.name.startswith("hyperband_test"))
    expected = ["hyperband_test"] + [f"hyperband_test-{i}" for i in range(2, len(SHARE_A_NAME) + 1)]
    assert stored == expected
    for name, trainable in zip(expected, SHARE_A_NAME.values(), strict=True):
        state = json.loads((results / name / "_lumos" / "tuner.json").read_text())
        assert state["trainable"] == trainable, name
