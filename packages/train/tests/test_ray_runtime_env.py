"""RunConfig(worker_runtime_env=...) on real Ray workers (session fixture ``ray_cluster``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import run_config

from lumos import train

pytestmark = pytest.mark.usefixtures("no_leaks")


def _report_env() -> None:
    train.report({"var": os.environ.get("LUMOS_RUNTIME_ENV_TEST"), "pid": os.getpid()})


def test_worker_runtime_env_vars_are_set_in_every_worker(tmp_path: Path, ray_cluster: str) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert "LUMOS_RUNTIME_ENV_TEST" not in os.environ  # only the workers get it
    result = train.DataParallelTrainer(
        _report_env,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "env",
            worker_runtime_env={"env_vars": {"LUMOS_RUNTIME_ENV_TEST": "from-runtime-env"}},
        ),
    ).fit()
    assert result.metrics["var"] == "from-runtime-env"
    assert result.metrics["pid"] != os.getpid()
