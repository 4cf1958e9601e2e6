"""FSDP2 and DCP sharded checkpoints without Ray: kwargs checks, and real gloo process
groups (torch.multiprocessing) saving with 4 ranks, resuming with 2 and back with 4."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Any

import fsdp_fns
import pytest
import torch

from lumos.train import TrainConfigError
from lumos.train.torch import prepare_model, save_sharded_state


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_unknown_fsdp_kwargs_are_named_with_the_allowed_ones() -> None:
    with pytest.raises(TrainConfigError) as err:
        prepare_model(torch.nn.Linear(2, 2), parallel_strategy="fsdp",
                      parallel_strategy_kwargs={"device_ids": [0], "mp_policy": None})  # fmt: skip
    text = str(err.value)
    assert "'device_ids'" in text
    assert "'mp_policy'" not in text.split("allowed")[0]
    for name in ("mesh", "reshard_after_forward", "mp_policy", "offload_policy", "shard_modules"):
        assert name in text


def test_unknown_strategy_is_refused_and_ddp_stays_the_default() -> None:
    with pytest.raises(TrainConfigError, match="'ddp' \\(default\\), 'fsdp' or None"):
        prepare_model(torch.nn.Linear(2, 2), parallel_strategy="zero3")
    import inspect

    assert inspect.signature(prepare_model).parameters["parallel_strategy"].default == "ddp"


def test_save_refuses_a_non_empty_directory_and_a_bad_checkpointer_type(tmp_path: Path) -> None:
    (tmp_path / "old.bin").write_bytes(b"x")
    with pytest.raises(TrainConfigError, match="not empty"):
        save_sharded_state(tmp_path, torch.nn.Linear(2, 2))
    with pytest.raises(TrainConfigError, match="async_checkpointer_type='fork'"):
        save_sharded_state(tmp_path / "new", torch.nn.Linear(2, 2), async_checkpointer_type="fork")


def test_single_process_save_and_load_round_trip(tmp_path: Path) -> None:
    from lumos.train.torch import gather_full_state, load_sharded_state

    model = fsdp_fns.tiny_model(0)
    opt = torch.optim.Adam(model.parameters())
    fsdp_fns.train_steps(model, opt, 2, seed=0)
    ckpt = save_sharded_state(tmp_path / "c", model, opt, extra_state={"step": 2})
    fresh = fsdp_fns.tiny_model(5)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    assert load_sharded_state(ckpt, fresh, fresh_opt) == {"step": 2}
    assert not fsdp_fns.equal(gather_full_state(fresh, fresh_opt), gather_full_state(model, opt))


def test_reshard_4_to_2_to_4_is_bit_identical_with_async_saves(tmp_path: Path) -> None:
    """Each phase asserts in its processes: the restored params and Adam state equal the
    saved ones bit for bit; async saves keep the state staged at the call although
    training goes on; mixed precision and CPU offload run on gloo."""
    import torch.multiprocessing as mp

    mp.spawn(fsdp_fns.reshard_worker, args=(str(tmp_path), _free_ports(4)), nprocs=4)
    for tag, world in (("w4-a", 4), ("w2-b", 2), ("w4-c", 4)):
        files = sorted(p.name for p in (tmp_path / tag).iterdir())
        assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(world)] + [
            "lumos_extra_state.pt"
        ], files


def _local_async_run(config: dict[str, Any]) -> None:
    from lumos import train
    from lumos.train.torch import gather_full_state, load_sharded_state

    model = fsdp_fns.tiny_model(0)
    opt = torch.optim.Adam(model.parameters())
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        config["resumed"] = load_sharded_state(ckpt, model, opt)
        config["equal"] = not fsdp_fns.equal(gather_full_state(model, opt), config["saved"])
        return
    for step in range(2):
        fsdp_fns.train_steps(model, opt, 1, seed=step)
        config["saved"] = gather_full_state(model, opt)
        c = save_sharded_state(tempfile.mkdtemp(), model, opt, extra_state={"step": step},
                               async_save=True, async_checkpointer_type="thread")  # fmt: skip
        train.report({"step": step}, checkpoint=c, checkpoint_dir_name=f"step={step}",
                     checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)  # fmt: skip


def test_async_save_with_an_async_report_commits_and_resumes_in_local_mode(
    tmp_path: Path,
) -> None:
    """``report(ASYNC)`` uploads a directory DCP is still writing only once it is written."""
    from lumos import train

    config: dict[str, Any] = {}

    def fit(name: str, resume: train.Checkpoint | None) -> train.Result:
        return train.DataParallelTrainer(
            _local_async_run,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=train.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
            resume_from_checkpoint=resume,
        ).fit()

    result = fit("async", None)
    assert result.checkpoint is not None
    assert Path(result.checkpoint.path).name == "step=1"
    files = sorted(p.name for p in Path(result.checkpoint.path).iterdir())
    assert files == [".metadata", "__0_0.distcp", "lumos_extra_state.pt"]
    fit("resumed", result.checkpoint)
    assert config["resumed"] == {"step": 1}
    assert config["equal"] is True


def _local_linked_run(config: dict[str, Any]) -> None:
    import os

    from lumos import train
    from lumos.train._internal import pending_saves

    model = fsdp_fns.tiny_model(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    fsdp_fns.train_steps(model, opt, 1, seed=0)
    local = tempfile.mkdtemp()
    c = save_sharded_state(local, model, opt, extra_state={"step": 0}, async_save=True)
    written = pending_saves.take(local)
    assert written is not None

    def wait_then_note_the_files(timeout_s: float | None) -> bool:
        done = written(timeout_s)
        if done:  # what the save wrote, before the upload thread places it in the run
            config["inodes"] = {
                n: os.stat(os.path.join(local, n)).st_ino for n in os.listdir(local)
            }
        return done

    pending_saves.register(local, wait_then_note_the_files)
    train.report({"step": 0}, checkpoint=c, checkpoint_dir_name="step=0",
                 checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)  # fmt: skip
    config["local"] = local


def test_an_async_sharded_save_is_linked_into_local_storage_not_copied(tmp_path: Path) -> None:
    """ASYNC deletes the save's directory after the upload, so on the run's own filesystem
    its files become the checkpoint's (hard links): no second copy, no second write."""
    import os

    from lumos import train

    config: dict[str, Any] = {}
    result = train.DataParallelTrainer(
        _local_linked_run,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(name="linked", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert result.checkpoint is not None
    committed = Path(result.checkpoint.path)
    inodes = {p.name: os.stat(p).st_ino for p in committed.iterdir()}
    assert inodes == config["inodes"]  # the very files the save wrote
    assert sorted(inodes) == [".metadata", "__0_0.distcp", "lumos_extra_state.pt"]
    assert not os.path.exists(config["local"])  # the save's directory went after the upload


def test_the_default_async_checkpointer_is_a_process_on_gpu_hosts_and_a_thread_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lumos.train._internal.torch import sharded

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert sharded.default_async_type() == "process"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sharded.default_async_type() == "thread"
