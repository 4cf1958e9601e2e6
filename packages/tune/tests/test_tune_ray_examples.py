"""Ray Tune's own example scripts (shipped in the ray wheel, no download) run under lumos
as ``lumos migrate`` rewrites them (for most, only their imports change from ``ray.tune``
to ``lumos.tune``), in one HOME and the default storage: the four that share a sweep
name one after the other, the rest beside them, as a user's scripts may run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
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


CONCURRENT = 4
"""Scripts running at once. They mostly wait (Ray's scripts sleep in their trials: the
Optuna ones 10 trials x 100 x 0.1 s), so running them side by side costs little more
than the longest chain."""

OWN_CLUSTER = re.compile(r"ray\.init\([^)]*num_cpus")
"""A script that starts Ray with its own resources (``ray.init(num_cpus=2)``) gets a
cluster of its own (joining one, Ray rejects ``num_cpus``); the others join the
session's cluster through ``RAY_ADDRESS``, as a script submitted to a cluster does."""

DASHBOARD_START_LIMITS = {
    "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "180",
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "240",
}
"""A script's own cluster starts Ray's dashboard, whose modules get 30 s by default: a
loaded machine (at load 20 here) took longer and the script failed before any trial."""


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


def _run(script: Path, home: Path, address: str) -> Run:
    # RAY_ADDRESS is the session's cluster, or "local" for a cluster of the script's own:
    # a bare ray.init() would otherwise join any cluster running on the machine.
    env = dict(os.environ, RAY_ADDRESS=address, HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    env = DASHBOARD_START_LIMITS | env
    done = subprocess.run(
        [sys.executable, str(script), "--smoke-test"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def _write_migrated(name: str, home: Path) -> Path:
    from lumos.storage.migrate import migrate_source

    source = (EXAMPLES / f"{name}.py").read_text()
    migrated = migrate_source(source)
    assert not migrated.warnings, (name, migrated.warnings)
    assert migrated.code == rewrite(source), name  # only their imports change
    script = home / f"{name}.py"
    script.write_text(migrated.code)
    return script


@pytest.fixture(scope="module")
def home(tmp_path_factory: Any) -> Path:
    return Path(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def runs(home: Path, ray_cluster: Any) -> Iterator[dict[str, Future[Run]]]:
    """Every script started as a user would run it, in one HOME: the scripts sharing a
    sweep name one after the other in IN_ORDER's order (which one gets which name is
    what the tests check), the others beside them."""
    scripts = {name: _write_migrated(name, home) for name in IN_ORDER}
    session = str(ray_cluster.address_info["gcs_address"])
    address = {
        n: "local" if OWN_CLUSTER.search(scripts[n].read_text()) else session for n in IN_ORDER
    }
    chain = [n for n in IN_ORDER if n in SHARE_A_NAME]
    futures: dict[str, Future[Run]] = {n: Future() for n in chain}

    def in_order() -> None:
        for name in chain:
            try:
                futures[name].set_result(_run(scripts[name], home, address[name]))
            except BaseException as error:  # this one's test (and the later ones') say so
                for later in chain[chain.index(name) :]:
                    futures[later].set_exception(error)
                return

    with ThreadPoolExecutor(CONCURRENT) as pool:
        pool.submit(in_order)
        for name in IN_ORDER:
            if name not in SHARE_A_NAME:
                futures[name] = pool.submit(_run, scripts[name], home, address[name])
        yield futures


@pytest.mark.parametrize("name", IN_ORDER)
def test_ray_example_runs_migrated_in_one_shared_home(
    name: str, home: Path, runs: dict[str, Future[Run]]
) -> None:
    run = runs[name].result(timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Best hyperparameters" in run.stdout
    assert (home / "lumos_results").is_dir()  # lumos ran it, not Ray Tune
    earlier = [n for n in IN_ORDER[: IN_ORDER.index(name)] if n in SHARE_A_NAME]
    if name in SHARE_A_NAME and earlier:  # another sweep took the name: this one runs beside
        said = " ".join(run.stdout.split())  # the console may wrap the line
        beside = f"hyperband_test-{len(earlier) + 1}"
        assert f"starting this one as '{beside}' beside it" in said, said[:3000]


def test_the_sweeps_sharing_a_name_were_kept_apart(
    home: Path, runs: dict[str, Future[Run]]
) -> None:
    for name in SHARE_A_NAME:
        runs[name].result(timeout=900)
    results = home / "lumos_results"
    stored = sorted(p.name for p in results.iterdir() if p.name.startswith("hyperband_test"))
    expected = ["hyperband_test"] + [f"hyperband_test-{i}" for i in range(2, len(SHARE_A_NAME) + 1)]
    assert stored == expected
    for name, trainable in zip(expected, SHARE_A_NAME.values(), strict=True):
        state = json.loads((results / name / "_lumos" / "tuner.json").read_text())
        assert state["trainable"] == trainable, name
