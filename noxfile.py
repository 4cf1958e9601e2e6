"""Sessions for the lumos monorepo.

``nox`` runs every package's tests, the integration tests, lint and typecheck.
``nox -s demo`` runs the Tune-over-Train demo, ``nox -s bench`` the benchmarks.

Each package session installs only that package (and the lumos packages it
declares) so that ``pip install lumos-train`` alone is proven to work without
optuna, and ``lumos-tune`` alone without torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))

nox.options.sessions = [
    "lint",
    "storage",
    "runtime",
    "train",
    "tune",
    "integration",
    "typecheck",
]
nox.options.error_on_missing_interpreters = True

STORAGE = "./packages/storage"
RUNTIME = "./packages/runtime-common"
TRAIN = "./packages/train"
TUNE = "./packages/tune"

# Tests, the demo and the benchmarks run on loopback only and always start a
# fresh local Ray instance:
# - RAY_ADDRESS=local: a bare ray.init() otherwise attaches to whatever cluster
#   /tmp/ray/ray_current_cluster names (ray.cluster_utils.Cluster writes it).
# - RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take 127.0.0.1 as the node IP
#   (and so MASTER_ADDR for torch.distributed); GLOO_SOCKET_IFNAME=lo keeps
#   gloo's pairs on loopback too. Explicit ray.init(address=...) still works.
TEST_ENV = {
    "RAY_ADDRESS": "local",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONFAULTHANDLER": "1",
}


def _install(session: nox.Session, *specs: str) -> None:
    session.install(*CONSTRAINTS, *specs)


def _assert_missing(session: nox.Session, module: str) -> None:
    """Fail the session when ``module`` is importable (proves a package's deps are minimal)."""
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; "
        f"sys.exit(f'{module} must not be installed here' if importlib.util.find_spec('{module}') else 0)",
    )


def _pytest(session: nox.Session, *paths: str) -> None:
    session.run("pytest", "-q", *paths, *session.posargs, env=TEST_ENV)


@nox.session
def storage(session: nox.Session) -> None:
    """lumos-storage alone: local, memory:// and S3 (moto server on loopback)."""
    _install(session, f"{STORAGE}[test]")
    _assert_missing(session, "ray")
    _pytest(session, "packages/storage/tests")


@nox.session
def runtime(session: nox.Session) -> None:
    """lumos-runtime-common with its own dependencies (Ray, no torch, no optuna)."""
    _install(session, STORAGE, f"{RUNTIME}[test]")
    _assert_missing(session, "torch")
    _assert_missing(session, "optuna")
    _pytest(
        session, "packages/runtime-common/tests", "--ignore=packages/runtime-common/tests/cluster"
    )
    # A simulated multi-node cluster: its own process (one Ray cluster per process).
    _pytest(session, "packages/runtime-common/tests/cluster")


@nox.session
def train(session: nox.Session) -> None:
    """lumos-train alone (with its [data] extra): proves it works without optuna."""
    _install(session, STORAGE, RUNTIME, f"{TRAIN}[test,data,lightning,transformers,mlflow,wandb]")
    _assert_missing(session, "optuna")
    _assert_missing(session, "lumos.tune")
    _pytest(session, "packages/train/tests", "--ignore=packages/train/tests/cluster")
    # A simulated multi-node cluster: its own process (one Ray cluster per process).
    _pytest(session, "packages/train/tests/cluster")


@nox.session
def tune(session: nox.Session) -> None:
    """lumos-tune alone: proves it installs and works without torch."""
    _install(session, STORAGE, RUNTIME, f"{TUNE}[test,mlflow,wandb]")
    _assert_missing(session, "torch")
    _assert_missing(session, "lumos.train")
    _pytest(session, "packages/tune/tests")


def _install_all(session: nox.Session, *extra: str) -> None:
    _install(
        session,
        f"{STORAGE}[test]",
        f"{RUNTIME}[test]",
        f"{TRAIN}[test,lightning,transformers,mlflow,wandb]",
        f"{TUNE}[test,mlflow,wandb]",
        "scikit-learn",
        *extra,
    )


@nox.session
def integration(session: nox.Session) -> None:
    """Everything that needs more than one package: Tune over Train, multi-node, S3."""
    _install_all(session)
    _pytest(session, "integration-tests")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format), the import rules between packages and the public-name tables."""
    _install(session, "ruff", "pytest")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run(
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "integration-tests/test_import_rules.py",
        "integration-tests/test_public_names.py",
    )


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy (strict) over every package's sources."""
    _install_all(session, "mypy", "pandas-stubs")
    session.run(
        "mypy",
        "packages/storage/src",
        "packages/runtime-common/src",
        "packages/train/src",
        "packages/tune/src",
    )


@nox.session
def demo(session: nox.Session) -> None:
    """Tune a small PyTorch classifier on scikit-learn's digits with Tune over Train."""
    _install_all(session)
    session.run("python", "examples/demo_tune_over_train.py", *session.posargs, env=TEST_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against bare Ray, Ray Train V2 and Ray Tune in the same run; prints ratios."""
    _install_all(session, "pyarrow")  # ray.tune, the baseline of bench_tune.py, needs it
    env = dict(TEST_ENV, RAY_TRAIN_V2_ENABLED="1")
    names = session.posargs or sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    for name in names:
        session.run("python", os.path.join("benchmarks", name), env=env)
