"""Elastic training and preemption on a simulated multi-node Ray cluster (real torch).

One cluster for the module (see conftest): the tests run in order and each leaves the
nodes as the next one expects (2 nodes, then 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import health_fns
import pytest
import ray
from fit_thread import FitThread
from ray.core.generated import autoscaler_pb2

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer


class Run(FitThread):
    """``fit()`` in a thread, so the test can change the cluster meanwhile."""

    def __init__(self, tmp_path: Path, workers: Any, **config: Any) -> None:
        max_failures = config.pop("max_failures", 0)
        self.log = str(tmp_path / "log.jsonl")
        self.until = str(tmp_path / "stop")
        super().__init__(
            TorchTrainer(
                health_fns.loop,
                train_loop_config={"log": self.log, "until": self.until, "step_s": 0.1, **config},
                scaling_config=train.ScalingConfig(
                    num_workers=workers, elastic_resize_monitor_interval_s=0.5
                ),
                run_config=train.RunConfig(
                    name="run",
                    storage_path=str(tmp_path),
                    failure_config=train.FailureConfig(max_failures=max_failures),
                ),
            )
        )

    def records(self) -> list[dict[str, Any]]:
        try:
            return health_fns.read_log(self.log)
        except FileNotFoundError:
            return []

    def starts(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "start" in r]

    def wait(
        self,
        what: str,
        ok: Callable[[], bool],
        timeout_s: float = 120.0,
        detail: Callable[[], Any] | None = None,
    ) -> None:
        super().wait(what, ok, timeout_s, detail or self.starts)

    def finish(self) -> train.Result:
        Path(self.until).touch()
        return self.join()


def _steps(result: train.Result) -> list[int]:
    return [row["step"] for row in result.metrics_history]


def test_starts_with_what_fits_grows_on_a_new_node_and_shrinks_on_a_lost_one(
    tmp_path: Path, cluster: Any
) -> None:
    run = Run(tmp_path, (2, 3), steps=5, max_failures=1)
    run.wait("the start at 2 workers", lambda: len(run.records()) > 3)
    assert [s["size"] for s in run.starts()] == [2]
    node = cluster.add_node(num_cpus=1)
    run.wait("the group to grow to 3", lambda: [s["size"] for s in run.starts()] == [2, 3])
    grown_at = run.starts()[1]["start"]
    steps_before = len(run.records())
    run.wait("training at 3", lambda: len(run.records()) > steps_before + 3)
    cluster.remove_node(node)
    run.wait("the group to shrink to 2", lambda: len(run.starts()) == 3)
    result = run.finish()
    starts = run.starts()
    assert [s["size"] for s in starts] == [2, 3, 2]
    assert grown_at > 0
    assert _steps(result) == list(range(len(result.metrics_history)))  # nothing lost
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    names = state.checkpoint_names()
    assert names == [f"step={s}" for s in range(len(names))]  # every commit kept


def test_a_fixed_size_that_does_not_fit_waits_for_resources(
    tmp_path: Path, cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(tmp_path, (3, 3), steps=3)
    seen = ""
    deadline = time.monotonic() + 60
    while "waiting for resources" not in seen:
        seen += capsys.readouterr().err
        assert time.monotonic() < deadline, "no 'waiting for resources' line"
        time.sleep(0.2)
    assert not run.starts()
    cluster.add_node(num_cpus=1)
    result = run.finish()
    assert [s["size"] for s in run.starts()] == [3]
    assert _steps(result)[:3] == [0, 1, 2]


def test_a_drained_nodes_ranks_checkpoint_and_move_without_a_failure(
    tmp_path: Path, cluster: Any
) -> None:
    run = Run(tmp_path, (2, 3), steps=5, every=10_000, on_notice=True)  # max_failures=0
    run.wait("training at 3", lambda: len(run.records()) > 3)
    assert [s["size"] for s in run.starts()] == [3]
    workers = run.trainer._last_controller.workers.workers  # type: ignore[union-attr]
    node_id = workers[1].node_id
    gcs = ray._raylet.GcsClient(address=cluster.address)  # type: ignore[attr-defined]
    accepted, why = gcs.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),  # type: ignore[attr-defined]
        "spot instance reclaimed",
        int((time.time() + 60) * 1000),
    )
    assert accepted, why
    run.wait("the ranks to move", lambda: len(run.starts()) == 2)
    result = run.finish()
    starts = run.starts()
    assert [s["size"] for s in starts] == [3, 2]
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    (first, *_) = state.checkpoint_names()  # taken because of the notice
    assert starts[1]["start"] == int(first.split("=")[1]) + 1
    assert _steps(result) == list(range(len(result.metrics_history)))
