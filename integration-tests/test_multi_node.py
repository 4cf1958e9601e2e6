"""A simulated 3-node cluster (ray.cluster_utils.Cluster, 2 CPUs per node).

* SPREAD places the workers of one run on different nodes, and the ranks the
  workers see (node rank, node id) say so.
* Removing a node in the middle of a run: the worker on it dies with it, the run
  restarts on the remaining nodes from its last committed checkpoint and finishes
  at the right step.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import workloads

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytestmark = pytest.mark.multi_node

STEPS = 6
HOLD_AT = 3  # the first attempt waits after this step's checkpoint until the node is gone


def test_spread_places_workers_on_different_nodes(multi_node: Any, storage_dir: str) -> None:
    result = TorchTrainer(
        workloads.placements,
        train_loop_config={},
        scaling_config=train.ScalingConfig(num_workers=3, placement_strategy="SPREAD"),
        run_config=train.RunConfig(name="spread", storage_path=storage_dir, verbose=False),
    ).fit()
    placements = result.metrics["placements"]  # [world_rank, node_rank, node_id] per rank
    assert [p[0] for p in placements] == [0, 1, 2]
    node_ids = [p[2] for p in placements]
    alive = {n["NodeID"] for n in _alive_nodes()}
    assert len(set(node_ids)) == 3, placements
    assert set(node_ids) <= alive
    assert sorted(p[1] for p in placements) == [0, 1, 2]  # one node rank per node
    assert RunStorage(storage_dir, "spread").list_uncommitted() == []


class _OnStep(train.Callback):
    """Sets ``reached`` (in the driver) once rank 0 reported ``step`` with a checkpoint."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.reached = threading.Event()
        self.metrics: dict[str, Any] = {}

    def on_report(self, metrics: dict[str, Any], checkpoint: train.Checkpoint | None) -> None:
        if metrics.get("step") == self.step and checkpoint is not None:
            self.metrics = dict(metrics)
            self.reached.set()


def test_node_removed_mid_run_restarts_on_remaining_nodes(
    multi_node: Any, storage_dir: str
) -> None:
    cluster = multi_node
    on_hold = _OnStep(HOLD_AT)
    trainer = TorchTrainer(
        workloads.steps_with_checkpoints,
        train_loop_config={"steps": STEPS, "hold_at": HOLD_AT, "gather": True},
        scaling_config=train.ScalingConfig(num_workers=3, placement_strategy="SPREAD"),
        run_config=train.RunConfig(
            name="lose-a-node",
            storage_path=storage_dir,
            failure_config=train.FailureConfig(max_failures=2),
            callbacks=[on_hold],
            verbose=False,
        ),
    )
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="fit", daemon=True)
    thread.start()
    assert on_hold.reached.wait(180), f"the run never reached step {HOLD_AT}: {outcome}"

    # remove a non-head node that runs one of the workers
    used = {p[2] for p in on_hold.metrics["placements"]}
    victims = [n for n in cluster.worker_nodes if n.node_id in used]
    assert victims, f"no worker on a removable node: {on_hold.metrics['placements']}"
    victim = victims[0]
    cluster.remove_node(victim)

    thread.join(240)
    assert not thread.is_alive(), "fit() did not return within 240 s of the node removal"
    assert "error" not in outcome, outcome.get("error")
    result: train.Result = outcome["result"]

    assert result.metrics["step"] == STEPS
    assert result.metrics["resumed_from"] == HOLD_AT  # from the last committed checkpoint
    assert result.metrics["world_size"] == 3
    final_nodes = {p[2] for p in result.metrics["placements"]}
    assert victim.node_id not in final_nodes
    steps = [row["step"] for row in result.metrics_history]
    assert steps == list(range(1, STEPS + 1))
    state = RunStorage(storage_dir, "lose-a-node").load_state()
    assert state is not None
    assert state.status == "finished"
    assert len(state.attempts) == 2
    assert RunStorage(storage_dir, "lose-a-node").list_uncommitted() == []


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n["Alive"]]
