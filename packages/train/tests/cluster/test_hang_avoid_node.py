"""The hang watchdog's restart on a simulated multi-node cluster (real torch, gloo).

* ``FailureConfig(hang_avoid_node=True)``: the watchdog names the stuck rank's node, and
  the restarted group starts on another one (a node is added for each test, so another
  alive node with a free CPU exists whatever the earlier tests of this folder left).
* Without it, only the stuck rank's process is replaced: the other rank keeps its
  process (its all-reduce fails once the stuck one is gone) and the run resumes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hang_fns
import pytest
from ray import cloudpickle

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchConfig, TorchTrainer


@pytest.fixture
def spare_node(cluster: Any) -> Iterator[None]:
    cloudpickle.register_pickle_by_value(hang_fns)
    import time

    import ray

    node = cluster.add_node(num_cpus=1)
    # this node only: Cluster.wait_for_nodes() also waits for any node an earlier test of
    # the session removed by force, and times out
    deadline = time.monotonic() + 60.0
    while not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} did not join in 60 s"
        time.sleep(0.2)
    yield
    cluster.remove_node(node)


def _fit(tmp_path: Path, workers: int, culprit: int, avoid: bool) -> list[dict[str, Any]]:
    """Run ``hang_fns.allreduce_loop`` with a stall; returns each rank's (node, pid) per start."""
    log = tmp_path / "starts.jsonl"

    def loop(config: dict[str, Any]) -> None:  # shipped by value (a local function)
        import ray as ray_

        rank = train.get_context().get_world_rank()
        node = ray_.get_runtime_context().get_node_id()
        with open(config["starts"], "a") as f:
            f.write(json.dumps({"rank": rank, "node": node, "pid": os.getpid()}) + "\n")
        hang_fns.allreduce_loop(config)

    config = {
        "steps": 4, "at": 2, "culprit": culprit, "how": "sleep",
        "marker": str(tmp_path / "stalled"), "tmp": str(tmp_path), "starts": str(log),
    }  # fmt: skip
    failure = train.FailureConfig(max_failures=1, hang_timeout_s=3.0, hang_avoid_node=avoid)
    result = TorchTrainer(
        loop,
        train_loop_config=config,
        torch_config=TorchConfig(timeout_s=600),  # gloo alone would wait 10 minutes
        scaling_config=train.ScalingConfig(num_workers=workers),
        run_config=train.RunConfig(name="run", storage_path=str(tmp_path), failure_config=failure),
    ).fit()
    assert result.metrics["step"] == 3
    assert result.metrics["start"] == 2  # resumed from the checkpoint of step 1
    state = RunStorage(tmp_path, "run").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["errored", "finished"]
    return [json.loads(x) for x in log.read_text().splitlines()]


def _hang(tmp_path: Path) -> dict[str, Any]:
    folder = tmp_path / "run" / "_lumos" / "hangs" / "attempt-0"
    found: dict[str, Any] = json.loads((folder / "hang.json").read_text())
    return found


@pytest.mark.usefixtures("spare_node")
def test_the_restarted_group_avoids_the_stuck_ranks_node(tmp_path: Path) -> None:
    first, restarted = _fit(tmp_path, workers=1, culprit=0, avoid=True)
    summary = _hang(tmp_path)
    assert summary["culprits"] == [0]
    assert summary["nodes"]["0"] == first["node"]
    assert restarted["node"] != first["node"]


@pytest.mark.long  # plain nox: the test above
@pytest.mark.usefixtures("spare_node")
def test_without_avoiding_only_the_stuck_ranks_process_is_replaced(tmp_path: Path) -> None:
    starts = _fit(tmp_path, workers=2, culprit=1, avoid=False)
    assert _hang(tmp_path)["culprits"] == [1]
    pids = {r: [s["pid"] for s in starts if s["rank"] == r] for r in (0, 1)}
    assert len(pids[0]) == 2
    assert pids[0][0] == pids[0][1]  # rank 0 kept its process
    assert len(pids[1]) == 2
    assert pids[1][0] != pids[1][1]  # the stuck rank's was replaced
