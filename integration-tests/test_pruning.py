"""Pruning through Train: a pruned trial's TorchTrainer stops its workers; the trial ends PRUNED
(also with FSDP2 and asynchronous sharded DCP checkpoints in flight)."""

from __future__ import annotations

import pytest
import workloads
from it_helpers import assert_pruned_run_stopped, sweep_good_and_bad

from lumos import train
from lumos.train.torch import TorchTrainer

MAX_STEPS = 3000  # a pruned run must stop far earlier
GOOD_STEPS = 5


def _trial(config: dict[str, float]) -> None:
    # Nothing Tune-specific: the run finds its trial through lumos.runtime's job context.
    max_steps = GOOD_STEPS if config["loss"] < 1.0 else MAX_STEPS
    TorchTrainer(
        workloads.fsdp_steps if config.get("fsdp") else workloads.report_steps,
        train_loop_config={"loss": config["loss"], "max_steps": max_steps},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    ).fit()


def test_pruned_trial_stops_its_train_workers(ray_cluster: str, storage_dir: str) -> None:
    # ThresholdPruner: deterministic, prunes the first report above 1.0.
    _, good, bad = sweep_good_and_bad(
        _trial, "prune", storage_dir, key="loss", good=0.5, bad=5.0, metric="loss", upper=1.0
    )
    assert good.metrics["step"] == GOOD_STEPS
    _, bad_run = assert_pruned_run_stopped(storage_dir, "prune", good, bad)
    steps = [row["step"] for row in bad_run.read_metrics()]
    assert 1 <= len(steps) < MAX_STEPS
    assert steps == list(range(1, len(steps) + 1))
    # ray_cluster's teardown: no worker actor or placement group left alive


@pytest.mark.long  # plain nox: the test above
def test_a_pruned_fsdp_trial_stops_its_workers_and_keeps_only_whole_sharded_checkpoints(
    ray_cluster: str, storage_dir: str
) -> None:
    _, good, bad = sweep_good_and_bad(
        _trial, "prune-fsdp", storage_dir, key="loss", good=0.5, bad=5.0, metric="loss",
        upper=1.0, constants={"fsdp": True},
    )  # fmt: skip
    assert good.metrics["step"] == GOOD_STEPS
    good_run, bad_run = assert_pruned_run_stopped(storage_dir, "prune-fsdp", good, bad)
    good_state = good_run.load_state()
    assert good_state is not None
    assert good_state.latest_checkpoint == f"step={GOOD_STEPS}"
    # every committed checkpoint of either run holds both ranks' shards and DCP's metadata
    for run in (good_run, bad_run):
        state = run.load_state()
        assert state is not None
        for record in state.checkpoints:
            listing = run.fs.ls(run.checkpoint_path(record.dir_name), detail=False)
            files = sorted(str(p).rsplit("/", 1)[-1] for p in listing)
            assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "lumos_extra_state.pt"]
