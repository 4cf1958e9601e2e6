"""Integration tests on one real local Ray cluster (session fixture ``ray_cluster``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import train_fns
from conftest import run_config
from drivers import kill_driver, start_driver, wait_for_state

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchConfig, TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_ddp_two_workers_match_one_process_on_the_same_global_batch(tmp_path: Path) -> None:
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, generator=g)
    y = torch.randn(8, 2, generator=g)
    config = {"x": x.tolist(), "y": y.tolist(), "lr": 0.1, "steps": 3}
    result = TorchTrainer(
        train_fns.ddp_step,
        train_loop_config=config,
        torch_config=TorchConfig(timeout_s=120),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "ddp"),
    ).fit()

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert result.metrics["rank"] == 0
    torch.testing.assert_close(torch.tensor(result.metrics["weight"]), model.weight.detach())
    torch.testing.assert_close(torch.tensor(result.metrics["bias"]), model.bias.detach())


@pytest.mark.parametrize("standby", [True, False], ids=["standby", "new-actor"])
def test_worker_sigkill_resumes_from_the_last_committed_checkpoint(
    tmp_path: Path, standby: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # rank 1 kills its own process at step 3, right after report(step 2) returned on
    # every rank: checkpoint_2 must be committed, so training resumes exactly at step 3.
    # With the standby worker (the default) a warm process takes over rank 1.
    caplog.set_level(logging.INFO, logger="lumos.runtime")
    config = {"steps": 6, "die": {"rank": 1, "step": 3, "how": "sigkill"}}
    failure = train.FailureConfig(max_failures=1, standby_worker=standby)
    result = TorchTrainer(
        train_fns.checkpointing_loop,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "sigkill", failure_config=failure),
    ).fit()
    took_over = [r for r in caplog.records if "standby worker" in r.getMessage()]
    assert len(took_over) == (1 if standby else 0), took_over
    assert result.metrics == {"step": 5, "start": 3, "attempt": 1}
    assert [row["step"] for row in result.metrics_history] == list(range(6))
    state = RunStorage(tmp_path, "sigkill").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["errored", "finished"]
    assert "died" in (state.attempts[0].error or "")


def test_user_error_is_raised_with_the_remote_traceback(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError) as info:
        train.DataParallelTrainer(
            train_fns.failing_loop,
            train_loop_config={"rank": 0},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, "usererr"),
        ).fit()
    err = info.value.worker_errors[0]
    assert "bad batch on purpose" in str(err)
    assert "train_fns.py" in str(err)  # the remote traceback is kept


def test_sharded_checkpoint_from_two_ranks(tmp_path: Path) -> None:
    result = train.DataParallelTrainer(
        train_fns.sharded_checkpoint,
        train_loop_config={},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "sharded"),
    ).fit()
    assert result.checkpoint is not None
    root = Path(result.checkpoint.path)
    assert root == tmp_path / "sharded" / "sharded"
    assert (root / "model_shard_0.bin").read_bytes() == bytes([0]) * 1000
    assert (root / "model_shard_1.bin").read_bytes() == bytes([1]) * 1001


def test_retention_keeps_best_n_by_score_plus_latest(tmp_path: Path) -> None:
    result = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": 5, "losses": [3.0, 1.0, 2.0, 0.5, 9.0]},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "retention",
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    names = sorted(p.name for p in (tmp_path / "retention").iterdir() if p.name != "_lumos")
    assert names == ["checkpoint_1", "checkpoint_3", "checkpoint_4"]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_4")
    assert sorted(m["loss"] for _, m in result.best_checkpoints) == [0.5, 1.0, 9.0]


def test_different_checkpoint_dir_names_across_ranks(tmp_path: Path) -> None:
    with pytest.raises(train.TrainingFailedError, match="different checkpoint_dir_name"):
        train.DataParallelTrainer(
            train_fns.mismatched_dir_names,
            train_loop_config={},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, "mismatch"),
        ).fit()


DRIVER = """
train.DataParallelTrainer(
    train_fns.checkpointing_loop,
    train_loop_config={{"steps": 40, "hold": {{"step": 3, "until": {hold!r}}}}},
    scaling_config=train.ScalingConfig(num_workers=2),
    run_config=train.RunConfig(name="driver-kill", storage_path={path!r}),
).fit()
"""


def test_job_level_restore_after_the_driver_is_sigkilled(tmp_path: Path, ray_cluster: str) -> None:
    hold = str(tmp_path / "never-created")
    body = DRIVER.format(path=str(tmp_path), hold=hold)
    proc = start_driver(tmp_path, ray_cluster, "train_fns", body)
    storage = RunStorage(tmp_path, "driver-kill")
    try:
        wait_for_state(proc, storage, lambda s: len(s.checkpoints) >= 3, "a commit of report #2")
    finally:
        kill_driver(proc)
    state = storage.load_state()
    assert state is not None
    assert state.status == "running"
    latest = state.latest()
    assert latest is not None

    result = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": 40},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(name="driver-kill", storage_path=str(tmp_path)),
    ).fit()
    assert result.metrics["step"] == 39
    assert result.metrics["start"] == latest.report_index + 1
    assert [row["step"] for row in result.metrics_history] == list(range(40))
    final = storage.load_state()
    assert final is not None
    assert final.status == "finished"


def test_peer_blocked_in_a_collective_is_released_when_a_rank_fails(tmp_path: Path) -> None:
    # rank 1 raises while rank 0 waits in a gloo barrier. The failing rank's process
    # group is destroyed as its function ends, so rank 0's barrier fails at once and the
    # survivors are reused; without that rank 0 would wait for the 10-minute gloo
    # timeout and the controller would fall back to a new group.
    trainer = TorchTrainer(
        train_fns.torch_barrier_loop,
        train_loop_config={"steps": 5},
        torch_config=TorchConfig(timeout_s=600),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "collective", failure_config=train.FailureConfig(max_failures=1)
        ),
    )
    result = trainer.fit()
    assert result.metrics == {"step": 4, "start": 3}
    assert trainer._last_controller is not None
    from lumos.train._internal.controller.state import SchedulingState

    scheduling = [s for s in trainer._last_controller.history if isinstance(s, SchedulingState)]
    assert [s.keep_group for s in scheduling] == [False, True]  # no fallback to a new group


def test_parent_job_stop_leaves_no_actors_or_placement_groups(tmp_path: Path) -> None:
    import threading

    from lumos.runtime.context import JobContext, running

    class Pruned(Exception):
        pass

    seen: list[int] = []

    def report(metrics: dict[str, int]) -> None:
        seen.append(metrics["i"])
        if len(seen) == 3:
            raise Pruned("the parent trial was pruned")

    ctx = JobContext(
        kind="tune.trial",
        name="trial_7",
        storage_path=str(tmp_path / "trial_7"),
        storage_filesystem=None,
        report=report,
        stop_event=threading.Event(),
        stop_error=lambda: Pruned("stopped"),
    )
    trainer = train.DataParallelTrainer(
        train_fns.stopping_loop,
        train_loop_config={},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(verbose=False),
    )
    with running(ctx), pytest.raises(Pruned, match="pruned"):
        trainer.fit()
    assert seen == [0, 1, 2]
    assert (tmp_path / "trial_7" / "train" / "_lumos" / "run_state.json").exists()
    # the no_leaks fixture then checks that no actor or placement group is left


def test_a_run_that_waits_for_resources_says_so_on_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ISSUE6 F2: 3 of the 4 CPUs are held by another placement group until the run has
    # printed why it waits; then they are released and the run starts and finishes.
    import logging
    import threading

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    blocker = placement_group([{"CPU": 3}])
    ray.get(blocker.ready(), timeout=60)
    printed = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for resources" in record.getMessage():
                printed.set()

    def release() -> None:
        printed.wait(60)
        remove_placement_group(blocker)

    seen = Seen()
    logging.getLogger("lumos.train").addHandler(seen)
    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    try:
        result = train.DataParallelTrainer(
            train_fns.metrics_only_loop,
            train_loop_config={"n": 1},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, "waits", verbose=True),
        ).fit()
    finally:
        logging.getLogger("lumos.train").removeHandler(seen)
        printed.set()
        releaser.join(60)
    assert result.metrics["i"] == 0
    err = capsys.readouterr().err
    assert "[lumos.train] waiting for resources: 0 of 2 worker(s) started" in err
    assert err.index("waiting for resources") < err.index("started 2 worker(s)")
