"""An elastic ``TorchftConfig`` run on a simulated multi-node Ray cluster (real torchft,
gloo): a lost node's rank leaves while the others train on, a new node's worker takes
the rank back from a live peer, and a drained node's rank moves before the deadline,
with no restart from a checkpoint.

The test brings its own nodes (an ``ft`` resource only they have) and removes them, so
it does not depend on what the earlier tests of this folder left.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import peer_fns
import pytest
import ray
from fit_thread import FitThread
from ray import cloudpickle
from ray.core.generated import autoscaler_pb2

from lumos import train
from lumos.storage import RunStorage

FT = {"CPU": 1.0, "ft": 1.0}


def _add_node(cluster: Any) -> Any:
    node = cluster.add_node(num_cpus=1, resources={"ft": 1})
    deadline = time.monotonic() + 60.0
    while not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node.node_id} did not join in 60 s"
        time.sleep(0.2)
    return node


def _latest_step(tmp_path: Path) -> int:
    state = RunStorage(tmp_path, "ft-elastic").load_state()
    latest = state.latest_checkpoint if state is not None else None
    return int(latest.split("=")[1]) if latest else -1


class _Run(FitThread):
    """``fit()`` in a thread; the ranks' logs (``peer_fns.log``) read as they grow."""

    def __init__(self, tmp_path: Path) -> None:
        from lumos.train.torch import TorchftConfig, TorchTrainer

        self.log_dir = tmp_path / "log"
        self.log_dir.mkdir()
        self.until = tmp_path / "until"
        config = {
            "log_dir": str(self.log_dir),
            "steps": 100_000,
            "until": str(self.until),
            "checkpoint_every": 20,
            "step_s": 0.05,
        }
        super().__init__(
            TorchTrainer(
                peer_fns.ft_train,
                train_loop_config=config,
                torch_config=TorchftConfig(),
                scaling_config=train.ScalingConfig(
                    num_workers=(2, 3),
                    resources_per_worker=FT,
                    elastic_resize_monitor_interval_s=0.5,
                ),
                run_config=train.RunConfig(
                    name="ft-elastic",
                    storage_path=str(tmp_path),
                    failure_config=train.FailureConfig(max_failures=1),
                ),
            )
        )

    def events(self, rank: int, kind: str) -> list[dict[str, Any]]:
        return [e for e in peer_fns.read_log(self.log_dir).get(rank, []) if e["event"] == kind]

    def committed(self, rank: int, n: int, since: float = 0.0) -> int:
        """Steps ``rank`` committed with ``n`` replicas after ``since``."""
        steps = self.events(rank, "step")
        return sum(1 for e in steps if e["ok"] and e["n"] == n and e["t"] > since)

    def node_of(self, rank: int) -> str:
        controller = self.trainer._last_controller
        assert controller is not None
        return controller.workers.workers[rank].node_id

    def finish(self) -> train.Result:
        last = max(e["step"] for r in range(3) for e in self.events(r, "step"))
        self.until.write_text(str((last // 10 + 3) * 10))  # a reported step
        return self.join()


@pytest.mark.long  # plain nox: test_peer_resize (the same moves)
def test_a_torchft_elastic_run_shrinks_grows_back_and_moves_without_a_restart(
    tmp_path: Path, cluster: Any
) -> None:
    pytest.importorskip("torchft")
    cloudpickle.register_pickle_by_value(peer_fns)
    nodes = [_add_node(cluster) for _ in range(3)]
    try:
        run = _Run(tmp_path)
        run.wait(
            "3 replicas training", lambda: all(run.committed(r, 3) >= 5 for r in range(3)), 180.0
        )

        # 1. rank 1's node is lost and no other has room: ranks 0 and 2 train on at 2
        lost_at = time.time()
        victim = run.node_of(1)
        cluster.remove_node(next(n for n in nodes if n.node_id == victim))
        run.wait("2 replicas training", lambda: run.committed(0, 2, lost_at) >= 10, 180.0)
        assert [len(run.events(r, "start")) for r in (0, 2)] == [1, 1]
        # the driver is not stuck waiting for room: checkpoints commit at 2
        at_loss = max(e["step"] for e in run.events(0, "step") if e["t"] <= lost_at)
        run.wait("a commit at 2", lambda: _latest_step(tmp_path) > at_loss + 20, 60.0)

        # 2. room comes back: a new worker takes rank 1 and its state from a live peer
        nodes.append(_add_node(cluster))
        back_at = time.time()
        run.wait("rank 1 back", lambda: run.committed(1, 3, back_at) >= 5, 180.0)
        assert len(run.events(1, "start")) == 2
        assert [e for e in run.events(1, "recovered") if e["t"] > back_at]

        # 3. rank 0's node is drained (a preemption notice, 60 s deadline): rank 0 moves
        # to the room a new node has, takes its state from a live peer, the old one ends
        nodes.append(_add_node(cluster))
        old_pid = run.events(0, "start")[-1]["pid"]
        deadline_s = time.time() + 60
        gcs = ray._raylet.GcsClient(address=cluster.address)  # type: ignore[attr-defined]
        accepted, why = gcs.drain_node(
            run.node_of(0),
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),  # type: ignore[attr-defined]
            "spot instance reclaimed",
            int(deadline_s * 1000),
        )
        assert accepted, why
        drained_at = time.time()

        def moved_and_stepping() -> bool:
            # the old process steps on at 3 until the move: count the new process's steps
            starts = run.events(0, "start")[1:]
            if not starts:
                return False
            steps = [e for e in run.events(0, "step") if e["pid"] == starts[-1]["pid"]]
            return sum(1 for e in steps if e["ok"] and e["n"] == 3) >= 5

        run.wait("rank 0 moved", moved_and_stepping, 180.0)
        (moved,) = run.events(0, "start")[1:]
        assert moved["pid"] != old_pid
        (recovered,) = [e for e in run.events(0, "recovered") if e["t"] > drained_at]
        assert recovered["t"] < deadline_s
        old_steps = [e for e in run.events(0, "step") if e["pid"] == old_pid]
        assert old_steps[-1]["t"] < deadline_s  # the old rank left before the deadline
        assert [len(run.events(r, "start")) for r in (1, 2)] == [2, 1]  # nobody else moved

        result = run.finish()
    finally:
        for node in nodes:
            if any(n.node_id == node.node_id for n in cluster.worker_nodes):
                cluster.remove_node(node)

    # one attempt from start to end: nothing restarted from a checkpoint
    state = RunStorage(tmp_path, "ft-elastic").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["finished"]
    target = int(run.until.read_text())
    assert result.metrics["step"] == target
    finals = [run.events(r, "done")[-1] for r in range(3)]
    assert [f["step"] for f in finals] == [target] * 3
    assert finals[0]["weights"] == finals[1]["weights"] == finals[2]["weights"]
