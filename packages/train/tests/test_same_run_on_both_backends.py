"""One training script through both backends stores the same run, record by record.

The Ray controller (``TrainController`` with worker ranks: ``FakeCluster``'s in-process
workers, and a real Ray cluster) and local mode (``num_workers=0``: the function in
this thread) both drive the run core (``controller/core.py``). The script commits
SYNC and ASYNC checkpoints, validates some of them, and is rolled back twice (a check
naming its checkpoint, then ``NonFiniteMetric``): the stored run state, the metrics
history and the checkpoint files must be the same. Only what genuinely depends on the
backend or the clock is left out: times.

(The ``ray`` case starts the session's Ray cluster, which ships ``train_fns`` by
value; this module sorts after the FakeCluster tests whose ``train_fns.EVENTS`` hold
locks that do not pickle.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import health_fns
import pytest
from conftest import run_config

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage

CONFIG = {"steps": 8, "nan_at": 7, "validate": [0, 1, 5, 7]}
"""The checks fire on reports that follow a SYNC checkpoint (so every checkpoint before
them is committed in either backend, whatever the ASYNC uploads' timing)."""
TIMES = {"created_at", "updated_at", "started_at", "ended_at", "at"}


def _checks() -> list[Any]:
    fired: list[int] = []

    def back_to_step_1(report: train.HealthReport, history: Any) -> train.Rollback | None:
        if report.source == "report" and report.index == 5 and not fired:
            fired.append(report.index)
            return train.Rollback("report 5 looks wrong", to_checkpoint="step=1")
        return None

    return [train.NonFiniteMetric("loss"), back_to_step_1]


def _fit(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> RunStorage:
    workers = 0 if backend == "local" else 1
    extra: dict[str, Any] = {}
    if backend == "fake":
        extra["_group_factory"] = FakeCluster().start
    elif backend == "ray":
        request.getfixturevalue("ray_cluster")
        from ray import cloudpickle

        # asked for here, not as an argument: the conftest's in-process fixture did not
        # see it and unregistered the shared test modules; Ray's workers need them by value
        cloudpickle.register_pickle_by_value(health_fns)
    train.DataParallelTrainer(
        health_fns.same_run,
        train_loop_config=dict(CONFIG),
        scaling_config=train.ScalingConfig(num_workers=workers),
        run_config=run_config(tmp_path, backend, health_checks=_checks()),
        validation_config=train.ValidationConfig(health_fns.validate),
        **extra,
    ).fit()
    return RunStorage(str(tmp_path), backend)


def _plain(value: Any) -> Any:
    """A record without its times, NaN spelled out (NaN != NaN)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _stored(storage: RunStorage) -> dict[str, Any]:
    state = storage.load_state()
    assert state is not None
    files = {
        c.dir_name: sorted(p.name for p in Path(storage.checkpoint_path(c.dir_name)).iterdir())
        for c in state.checkpoints
    }
    plain = _plain(json.loads(state.model_dump_json())) | {"name": None}
    for attempt in plain["attempts"]:  # where each rank ran and how the ranks were started
        attempt.pop("workers", None)  # (a standby, a new group) are the backend's own: the
        attempt.pop("restart", None)  # Ray group records them, local mode has one process
    return {
        "state": plain,
        "history": _plain(storage.read_metrics()),
        "files": files,
    }


@pytest.mark.parametrize("ray_backend", ["fake", "ray"])
def test_the_ray_controller_and_local_mode_store_the_same_run(
    tmp_path: Path, ray_backend: str, request: pytest.FixtureRequest
) -> None:
    local = _stored(_fit(tmp_path, "local", request))
    ray = _stored(_fit(tmp_path, ray_backend, request))
    state = local["state"]
    # what the run did, in both: two rollbacks, renamed checkpoints, merged validations
    assert [a["status"] for a in state["attempts"]] == ["rolled_back", "rolled_back", "finished"]
    assert [r["to_checkpoint"] for r in state["rollbacks"]] == ["step=1", "step=6"]
    assert state["rollbacks"][0]["rolled_back"] == [f"step={s}.rolled-back-1" for s in (2, 3, 4)]
    validated = [c["dir_name"] for c in state["checkpoints"] if c["validation_status"]]
    assert validated == ["step=0", "step=1", "step=5", "step=7"]
    assert [row["step"] for row in local["history"]] == list(range(8))
    assert local["history"][7]["val_loss"] == 5.0
    # record by record, the same
    for key in ("status", "latest_checkpoint", "report_count", "rollbacks", "attempts"):
        assert ray["state"][key] == state[key], key
    for mine, theirs in zip(ray["state"]["checkpoints"], state["checkpoints"], strict=True):
        assert mine == theirs
    assert ray["state"] == state
    assert ray["history"] == local["history"]
    assert ray["files"] == local["files"]
