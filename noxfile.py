"""Sessions for the lumos monorepo.

``nox`` runs every package's tests, the integration tests, lint, the docs build and typecheck.
``nox -s demo`` runs the Tune-over-Train demo, ``nox -s bench`` the benchmarks.

Each package session installs only that package (and the lumos packages it
declares) so that ``pip install lumos-train`` alone is proven to work without
optuna, and ``lumos-tune`` alone without torch.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))

# ``nox`` runs these two at a time (nox's own ``--parallel``): each session in its own
# virtualenv, on its own Ray cluster and ports, its output printed whole when it ends. A
# clean clone on this 2-core machine: 16 minutes two at a time, 22 one after the other
# (the same 27-28 CPU-minutes; one after the other the cores were 60% busy, since many
# tests wait on Ray, subprocesses and timeouts). ``nox -j 1`` runs them one after the
# other, longest first (the order below). Only these sessions run side by side: bench,
# long, soak and demo always run alone. See docs/contributing.md.
nox.options.parallel = 2
nox.options.sessions = [
    "train",
    "integration",
    "hosts",
    "tune",
    "runtime",
    "typecheck",
    "storage",
    "lint",
    "docs",
]
nox.options.error_on_missing_interpreters = True
# uv builds a session's virtualenv and installs into it in seconds (pip took ~9 of
# the full run's minutes); without uv on PATH nox falls back to the stdlib venv + pip.
nox.options.default_venv_backend = "uv|venv"

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
    # uv installs no .pyc files, and with PYTHONDONTWRITEBYTECODE set (this workplace's
    # shells set it) every process compiled ray, torch & co. from source: 4.3 instead of
    # 2.0 CPU-s to import ray + torch + lumos.train, in every Ray worker, driver and
    # daemon. Empty: Python caches what it imports, once.
    "PYTHONDONTWRITEBYTECODE": "",
    "RAY_ADDRESS": "local",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "GLOO_SOCKET_IFNAME": "lo",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONFAULTHANDLER": "1",
    # Ray starts one idle worker process per CPU when a cluster's first driver connects,
    # and more ahead of demand; here (4 logical CPUs on 2 cores, dozens of clusters and
    # jobs per run) most died unused: 130 processes, 5.4 of the run's 63 CPU-minutes. A
    # test's workers now start when it asks for them (about a second, once).
    "RAY_prestart_worker_first_driver": "0",
    "RAY_enable_worker_prestart": "0",
}


@functools.cache
def _pip_sources() -> dict[str, str]:
    """pip's find-links and extra index URLs (env and config files) as uv's variables.

    uv reads neither pip.conf nor ``PIP_*``: without this it would not see wheels
    that pip finds on this machine's disk (torch's CPU build) and would take other
    builds from the index. ``UV_*`` already set win.
    """
    found: dict[str, list[str]] = {"find-links": [], "extra-index-url": [], "index-url": []}
    try:
        listing = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in found:
            found[name] += shlex.split(value.strip().strip("'\""))
    for name in found:
        found[name] += os.environ.get(f"PIP_{name.upper().replace('-', '_')}", "").split()
    uv = {
        "UV_FIND_LINKS": " ".join(dict.fromkeys(found["find-links"])),
        "UV_EXTRA_INDEX_URL": " ".join(dict.fromkeys(found["extra-index-url"])),
        "UV_INDEX_URL": (found["index-url"] or [""])[0],
        # pip's rule: the best version across all indexes, not the first index's.
        "UV_INDEX_STRATEGY": "unsafe-best-match",
    }
    return {k: v for k, v in uv.items() if v and k not in os.environ}


def _install(session: nox.Session, *specs: str) -> None:
    if session.venv_backend == "uv":
        session.install(*CONSTRAINTS, *specs, env=dict(_pip_sources()))
    else:
        session.install(*CONSTRAINTS, *specs)


def _assert_missing(session: nox.Session, module: str) -> None:
    """Fail the session when ``module`` is importable (proves a package's deps are minimal)."""
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; "
        f"sys.exit(f'{module} must not be installed here' if importlib.util.find_spec('{module}') else 0)",
    )


LONG = "long"
"""The marker of a long scenario (a sweep, a partition, a kill in the middle of a large
run): plain ``nox`` leaves those out, ``nox -s long`` runs only them. Each one's
behaviour is also proven by a shorter test that stays in plain ``nox``."""


def _pytest(session: nox.Session, *paths: str, marks: str = f"not {LONG}") -> None:
    # pytest exits 5 when the marker selects nothing: only ``long`` may meet a folder so
    session.run(
        "pytest",
        "-q",
        "--durations=15",
        "-m",
        marks,
        *paths,
        *session.posargs,
        env=TEST_ENV,
        success_codes=[0, 5] if marks == LONG else [0],
    )


@nox.session(allow_parallel=True)
def storage(session: nox.Session) -> None:
    """lumos-storage alone: local, memory:// and S3 (moto server on loopback)."""
    _install(session, f"{STORAGE}[test]")
    _assert_missing(session, "ray")
    _pytest(session, "packages/storage/tests")


@nox.session(allow_parallel=True)
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


@nox.session(allow_parallel=True)
def train(session: nox.Session) -> None:
    """lumos-train alone (with its [data] extra): proves it works without optuna."""
    _install(
        session, STORAGE, RUNTIME, f"{TRAIN}[test,data,lightning,transformers,mlflow,wandb,torchft]"
    )
    _assert_missing(session, "optuna")
    _assert_missing(session, "lumos.tune")
    _pytest(session, "packages/train/tests", "--ignore=packages/train/tests/cluster")
    # A simulated multi-node cluster: its own process (one Ray cluster per process).
    _pytest(session, "packages/train/tests/cluster")


@nox.session(allow_parallel=True)
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


@nox.session(allow_parallel=True)
def integration(session: nox.Session) -> None:
    """Everything that needs more than one package: Tune over Train, multi-node, S3, and
    the documentation's examples."""
    _install_all(session, "pyarrow")  # Ray Data, for the data guide's example
    _pytest(
        session,
        "integration-tests",
        "--ignore=integration-tests/soak",
        "--ignore=integration-tests/hosts",
    )
    # The short chaos soak starts its own cluster: a pytest process of its own.
    _pytest(session, "integration-tests/soak")


@nox.session(allow_parallel=True)
def hosts(session: nox.Session) -> None:
    """Real hosts (network namespaces on a bridge): DDP, host loss, a second driver, ls.

    Needs root and iproute2 (skipped with the reason otherwise). Nothing here sets
    GLOO_SOCKET_IFNAME. The partition, drain, elastic and sweep scenarios: ``nox -s long``.
    """
    _install_all(session)
    reason = _hosts_missing(session)
    if reason:
        session.skip(reason)
    _hosts_pytest(session, f"not {LONG}")


def _hosts_missing(session: nox.Session) -> str:
    """Why the real hosts cannot be made here (not root, no iproute2), or ``""``."""
    check = str(session.run("python", "integration-tests/hosts/hosts.py", silent=True) or "")
    return "" if check.strip() == "ok" else check.strip()


def _hosts_pytest(session: nox.Session, marks: str) -> None:
    # the hosts' own addresses: no loopback-only Ray, no interface, no address given
    loopback_only = {"GLOO_SOCKET_IFNAME", "RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env = {k: v for k, v in TEST_ENV.items() if k not in loopback_only}
    session.run(
        "pytest",
        "-q",
        "--durations=8",
        "-m",
        marks,
        "integration-tests/hosts",
        *session.posargs,
        env=env,
        success_codes=[0, 5] if marks == LONG else [0],
    )


@nox.session
def long(session: nox.Session) -> None:
    """The long scenarios (tests marked ``long``) of train, tune, the integration tests
    and the real hosts, in one virtualenv with every package: 11 minutes on 2 cores.

    Run it before you land a change to failure handling, peer recovery, FSDP, the hosts
    or Tune's schedulers; ``nox -s long -- -k partition`` runs one.
    """
    _install_all(session, "pyarrow", "torchft")
    _pytest(session, "packages/train/tests", "--ignore=packages/train/tests/cluster", marks=LONG)
    _pytest(session, "packages/train/tests/cluster", marks=LONG)
    _pytest(session, "packages/tune/tests", marks=LONG)
    _pytest(
        session,
        "integration-tests",
        "--ignore=integration-tests/soak",
        "--ignore=integration-tests/hosts",
        marks=LONG,
    )
    reason = _hosts_missing(session)
    if reason:
        session.warn(f"the hosts' long scenarios did not run: {reason}")
    else:
        _hosts_pytest(session, LONG)


@nox.session(allow_parallel=True)
def lint(session: nox.Session) -> None:
    """ruff (lint + format), the house rules, the public-name tables, and no storage
    call that bypasses the retry helpers."""
    _install(session, "ruff", "pytest")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run(
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "integration-tests/test_house_rules.py",
        "integration-tests/test_public_names.py",
        "integration-tests/test_storage_paths.py",
    )


@nox.session(allow_parallel=True)
def docs(session: nox.Session) -> None:
    """The documentation site into site/: ``mkdocs build --strict`` (any warning fails it:
    a broken link or anchor, a page left out of the nav, a docstring griffe cannot read),
    then the site's own checks (nav, links, anchors, every Ray name in "Coming from Ray").
    The guides' examples run in ``nox -s integration`` (test_docs_examples.py)."""
    _install(session, "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python")
    _install(session, "pytest", "pyyaml")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "-q", "-p", "no:cacheprovider", "integration-tests/test_docs_site.py")


@nox.session(allow_parallel=True)
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
def soak(session: nox.Session) -> None:
    """The chaos soak on demand: ``nox -s soak -- [--minutes N] --seed S | --seeds N [--storage ...]``.

    With torchft installed, so that its Train run with ``TorchftConfig`` is one of the
    workloads (the short soak in ``integration`` runs without it)."""
    _install_all(session, "torchft")
    env = {k: v for k, v in TEST_ENV.items() if k != "RAY_ADDRESS"}  # it starts its own cluster
    args = list(session.posargs) or ["--seed", "1"]
    if "--minutes" not in args:
        args = ["--minutes", "10", *args]
    session.run("python", "integration-tests/soak/soak.py", *args, env=env)


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
        args = BENCH_ARGS.get(name, [])
        session.run("python", os.path.join("benchmarks", name), *args, env=env)


# benchmarks whose default run is long: their short version here (the full run: run the
# script itself, e.g. `python benchmarks/bench_goodput.py`, > 20 minutes)
BENCH_ARGS = {"bench_goodput.py": ["--quick"]}


# distribution name -> (folder, what a user imports); sibling wheels come from dist/.
WHEELS = {
    "lumos_storage": (STORAGE, "lumos.storage"),
    "lumos_runtime_common": (RUNTIME, "lumos.runtime"),
    "lumos_train": (TRAIN, "lumos.train, lumos.train.torch"),
    "lumos_tune": (TUNE, "lumos.tune, lumos.tune.cli"),
}


@nox.session
def build(session: nox.Session) -> None:
    """The four wheels and sdists in dist/, checked, each installed ALONE in a fresh venv.

    Each wheel gets a fresh ``python -m venv`` with only its declared dependencies:
    the sibling lumos wheels from dist/, the rest from the index with the pins. There
    it must import (and lumos-storage's ``lumos --help`` must run). Not in the default
    sessions: it installs torch and Ray from scratch (``nox -s build`` to run it).
    """
    import shutil

    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    _install(session, "build", "twine")
    for folder, _ in WHEELS.values():
        session.run("python", "-m", "build", "--outdir", str(dist), folder)
    session.run("twine", "check", "--strict", *sorted(str(p) for p in dist.iterdir()))
    for dist_name, (_, modules) in WHEELS.items():
        (wheel,) = dist.glob(f"{dist_name}-*.whl")
        venv = Path(session.create_tmp()) / f"alone-{dist_name}"
        session.run("python", "-m", "venv", "--clear", str(venv))
        python, bin_dir = str(venv / "bin" / "python"), venv / "bin"
        pip = [python, "-m", "pip", "install", "-q", *CONSTRAINTS, "--find-links", str(dist)]
        session.run(*pip, str(wheel), external=True)
        names = modules.split(", ")
        code = "; ".join(f"import {m}" for m in names) + f"; print({names[0]}.__version__)"
        session.run(python, "-c", code, external=True)
        if dist_name == "lumos_storage":
            session.run(str(bin_dir / "lumos"), "--help", external=True)
