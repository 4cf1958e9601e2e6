"""FSDP2 + DCP helpers for the tests: tiny models, and the multi-process gloo phases of
``test_fsdp_unit.py`` (spawned by torch.multiprocessing) and ``test_fsdp_ray.py``."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.distributed as dist


class Block(torch.nn.Module):
    """A residual MLP block: the unit ``shard_modules=(Block,)`` shards on its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def tiny_model(seed: int, width: int = 8, depth: int = 2) -> torch.nn.Module:
    """A few ``Block``s and a head, with deterministic weights for ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Block(width) for _ in range(depth)], torch.nn.Linear(width, 3))


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    """``steps`` Adam steps on this rank's deterministic random batches."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def equal(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths where two nested state dicts differ (tensors compared bit for bit)."""
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in a for d in equal(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list | tuple):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in equal(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [f"{where}: tensors differ"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _init(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _sharded(seed: int, world: int, **kwargs: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from lumos.train._internal.torch.fsdp import shard_model

    model = shard_model(
        tiny_model(seed), {"shard_modules": (Block,), **kwargs}, torch.device("cpu"), world
    )
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def _merge(rank_dirs: list[str], dest: str) -> None:
    """What the upload of every rank's directory into one checkpoint does."""
    for d in rank_dirs:
        shutil.copytree(d, dest, dirs_exist_ok=True)


def _save_phase(
    rank: int,
    world: int,
    port: int,
    root: str,
    tag: str,
    seed: int,
    load_from: str | None,
    async_save: str | None,
) -> None:
    """Train (or load ``load_from`` and compare it with its reference), then save ``tag``."""
    from lumos.train._internal import pending_saves
    from lumos.train.torch import gather_full_state, load_sharded_state, save_sharded_state

    _init(rank, world, port)
    model, opt = _sharded(seed, world)
    if load_from is None:
        train_steps(model, opt, 2, seed=rank)
    else:
        extra = load_sharded_state(os.path.join(root, load_from), model, opt)
        ref = torch.load(os.path.join(root, f"{load_from}.ref.pt"), weights_only=True)
        diffs = equal(gather_full_state(model, opt), ref)
        assert not diffs, (
            f"rank {rank}/{world}: resumed state differs from {load_from}: {diffs[:5]}"
        )
        assert extra == {"saved_by": ref_world(load_from)}, extra
        train_steps(model, opt, 1, seed=100 + rank)
    full = gather_full_state(model, opt)
    mine = os.path.join(root, f"{tag}.rank{rank}")
    save_sharded_state(mine, model, opt, extra_state={"saved_by": world},
                       async_save=async_save is not None, async_checkpointer_type=async_save or "process")  # fmt: skip
    if async_save:  # training goes on while the files are written: they keep the staged state
        train_steps(model, opt, 2, seed=200 + rank)
        pending_saves.wait_now(mine)
    dist.barrier()
    if rank == 0:
        torch.save(full, os.path.join(root, f"{tag}.ref.pt"))
        _merge(
            [os.path.join(root, f"{tag}.rank{r}") for r in range(world)], os.path.join(root, tag)
        )
    dist.barrier()
    dist.destroy_process_group()


def ref_world(tag: str) -> int:
    """The world size a checkpoint tag of ``reshard_worker`` was saved by (``w4``: 4)."""
    return int(tag.split("-")[0][1:])


def _policies_phase(rank: int, world: int, port: int) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    _init(rank, world, port)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, opt = _sharded(0, world, mp_policy=mp, offload_policy=CPUOffloadPolicy(pin_memory=False))
    out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16, out.dtype
    train_steps(model, opt, 1, seed=rank)
    weight = model[0].up.weight
    assert isinstance(weight, DTensor)
    assert weight.dtype == torch.float32
    assert weight.to_local().shape[0] == 16 // world  # this rank's rows only
    dist.destroy_process_group()


def reshard_worker(rank: int, root: str, ports: list[int]) -> None:
    """4 ranks save (async) -> 2 load, compare, save (async again: the cached staging
    buffers are reused) -> 4 load, compare, save (sync); then the
    policies on 2 ranks. One spawn: the phases re-form process groups in-process."""
    _save_phase(rank, 4, ports[0], root, "w4-a", 1, None, async_save="thread")
    if rank < 2:
        _save_phase(rank, 2, ports[1], root, "w2-b", 2, "w4-a", async_save="thread")
    _save_phase(rank, 4, ports[2], root, "w4-c", 3, "w2-b", async_save=None)
    if rank < 2:
        _policies_phase(rank, 2, ports[3])


def fsdp_run(config: dict[str, Any]) -> None:
    """A Train function: FSDP2 via ``prepare_model``, a DCP checkpoint every step.

    On a resume it loads the latest checkpoint (whatever world size saved it) and checks
    it bit for bit against the full state rank 0 kept at that save (``refs/<step>.pt``);
    rank 0 appends ``world resumed_step`` to ``log``. ``kill_at``: rank 1 SIGKILLs itself
    right after that step's ASYNC report returned (its shards still being written), once.
    ``nan_at``: every report carries a ``loss`` (the step), NaN at that step unless the
    function resumed from a checkpoint (a health check's rollback restarts it).
    """
    import json
    import signal
    import tempfile

    from lumos import train
    from lumos.train.torch import (
        gather_full_state,
        load_sharded_state,
        prepare_model,
        save_sharded_state,
    )

    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = prepare_model(tiny_model(world), parallel_strategy="fsdp",
                          parallel_strategy_kwargs={"shard_modules": (Block,)})  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    start, resumed = 0, None
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        resumed = load_sharded_state(ckpt, model, opt)["step"]
        ref = torch.load(os.path.join(config["refs"], f"{resumed}.pt"), weights_only=True)
        diffs = equal(gather_full_state(model, opt), ref)
        assert not diffs, f"rank {rank}/{world}: resumed state differs: {diffs[:5]}"
        start = resumed + 1
    if rank == 0:
        with open(config["log"], "a") as f:
            f.write(json.dumps({"world": world, "resumed_step": resumed}) + "\n")
    kind = config["async"]  # None (sync), "thread" or "process"
    mode = train.CheckpointUploadMode.ASYNC if kind else train.CheckpointUploadMode.SYNC
    for step in range(start, config["steps"]):
        if step in (config.get("kill_at"), config.get("nan_at")):
            # the previous one committed: what the kill resumes from, and what the NaN
            # report rolls back to (an ASYNC upload still in flight when a check fires is
            # stopped with the ranks, and the rollback goes to the one before it)
            train.get_all_reported_checkpoints()
        train_steps(model, opt, 1, seed=1000 * step + rank)
        full = gather_full_state(model, opt)
        if rank == 0:
            torch.save(full, os.path.join(config["refs"], f"{step}.pt"))
        ckpt = save_sharded_state(tempfile.mkdtemp(), model, opt, extra_state={"step": step},
                                  async_save=bool(kind), async_checkpointer_type=kind or "process")  # fmt: skip
        metrics: dict[str, Any] = {"step": step, "world": world}
        if "nan_at" in config:  # the first attempt reports a NaN loss at that step
            bad = step == config["nan_at"] and resumed is None
            metrics["loss"] = float("nan") if bad else float(step)
        train.report(metrics, checkpoint=ckpt,
                     checkpoint_dir_name=f"step={step}", checkpoint_upload_mode=mode)  # fmt: skip
        marker = os.path.join(config["refs"], "killed")
        if step == config.get("kill_at") and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
