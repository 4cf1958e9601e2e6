"""What the soak's drivers run on the cluster: the training functions (with and without
``TorchftConfig``), their validation and the Tune trial.

Workers import this module by name (the drivers put this folder on the Ray job's
code search path). It writes two things outside the system under test, into the
harness's own directory (``config["ledger_dir"]``):

* ``ledger/<run>.jsonl``: one JSON line per ``train.report`` that returned on a rank
  (``run``, ``rank``, ``step``, ``ckpt``, ``mode``, ``attempt``, ``pid``, ``seen``:
  the latest committed checkpoint this rank knows of right after the report; ``job``:
  the Ray job id of the driver whose run it is, ``t``: when);
* ``markers/<run>/rank<r>.json``: this rank's pid and what it is doing now
  (``"step"``, ``"checkpoint"`` with the step, ``"done"`` once the training function
  returns), so the fault injector finds the worker processes, can kill one in the
  middle of a checkpoint upload, and knows when training finished;
* ``markers/<run>/validation.json``: the validation running now (``"validating"``)
  or the last one that ended (``"validated"``), with its checkpoint.

The Tune trial appends ``start`` / ``end`` lines to ``ledger/trials.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from typing import Any

from lumos import train

# torch is imported in the functions, not here: unpickling a function of this module
# happens inside the worker's launch call, which the health check times (finding 2 of
# the soak: a fresh worker importing torch on a starved CPU was declared hung).

META = "meta.json"


def shard_name(rank: int) -> str:
    """The file each rank writes into every checkpoint (sharded checkpoints)."""
    return f"shard-{rank}.pt"


def _append(path: str, record: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one small O_APPEND write: lines never interleave
    finally:
        os.close(fd)


def _write_json(path: str, doc: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _mark(config: dict[str, Any], rank: int, doing: str, step: int) -> None:
    directory = os.path.join(config["ledger_dir"], "markers", config["run"])
    doc = {"pid": os.getpid(), "doing": doing, "step": step, "t": time.time()}
    _write_json(os.path.join(directory, f"rank{rank}.json"), doc)


def _name_of(checkpoint: Any) -> str | None:
    return None if checkpoint is None else str(checkpoint.path).rstrip("/").rsplit("/", 1)[-1]


def stall_file(ledger_dir: str, pid: int) -> str:
    """Where the soak asks worker ``pid`` to stall its training thread (user_thread_stall)."""
    return os.path.join(ledger_dir, "stall", f"{pid}.json")


def _maybe_stall(config: dict[str, Any], where: str) -> None:
    """Sleep in the training thread when the soak asked for it here (no lumos involved)."""
    path = stall_file(config["ledger_dir"], os.getpid())
    try:
        with open(path) as f:
            ask = json.load(f)
    except (OSError, ValueError):
        return
    if ask.get("where") != where:
        return
    with contextlib.suppress(OSError):
        os.remove(path)
    started = {"pid": os.getpid(), "s": ask["s"], "where": where, "t": time.time()}
    _append(os.path.join(config["ledger_dir"], "stall", "started.jsonl"), started)
    time.sleep(float(ask["s"]))


def train_fn(config: dict[str, Any]) -> None:
    """``config["steps"]`` steps of ``step_s`` each; a sharded checkpoint every
    ``ckpt_every`` steps (each rank saves its own shard), validated every
    ``validate_every`` steps; resumes from ``train.get_checkpoint()`` and checks
    that every shard of it loads and belongs to its step.
    """
    import torch
    import torch.distributed as dist

    from lumos.runtime import worker

    session = worker.get_session()
    assert session is not None
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    mode = (
        train.CheckpointUploadMode.ASYNC
        if config["mode"] == "async"
        else train.CheckpointUploadMode.SYNC
    )
    job_id = _ray_job_id()
    start = 0
    weights = torch.zeros(config["shard_floats"])
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, META)) as f:
                start = int(json.load(f)["step"])
            shard = torch.load(os.path.join(d, shard_name(rank)), weights_only=True)
            if int(shard["step"]) != start or int(shard["rank"]) != rank:
                raise RuntimeError(f"shard of rank {rank} does not belong to step {start}: {shard}")
            weights = shard["w"]
    _mark(config, rank, "step", start)
    for step in range(start + 1, int(config["steps"]) + 1):
        total = torch.ones(1)
        _maybe_stall(config, "before_all_reduce")  # the others wait in the all-reduce
        dist.all_reduce(total)  # every rank is alive and in the group
        _maybe_stall(config, "after_all_reduce")  # ... in the next step's all-reduce
        weights = weights + 1.0
        session.stop_event.wait(float(config["step_s"]))
        x = float(config.get("x", 1.5))
        metrics = {"step": step, "loss": (x - 1.5) ** 2 + 1.0 / step, "attempt": ctx.get_attempt()}
        name = None
        if step % int(config["ckpt_every"]) == 0:
            name = f"step={step}"
            d = tempfile.mkdtemp(prefix="soak-ckpt-")
            torch.save(
                {"step": step, "rank": rank, "w": weights}, os.path.join(d, shard_name(rank))
            )
            _report_checkpoint(config, rank, step, metrics, d, mode)
        else:
            train.report(metrics)
        _reported(config, rank, step, name, config["mode"], job_id)
    _mark(config, rank, "done", int(config["steps"]))


def _report_checkpoint(
    config: dict[str, Any], rank: int, step: int, metrics: dict[str, Any], d: str, mode: Any
) -> None:
    """Report checkpoint ``step=<step>`` of the files in ``d`` (rank 0 adds ``meta.json``),
    validated every ``validate_every`` steps; a SYNC report's files are removed after."""
    if rank == 0:
        with open(os.path.join(d, META), "w") as f:
            json.dump({"step": step}, f)
    _mark(config, rank, "checkpoint", step)
    train.report(
        metrics,
        checkpoint=train.Checkpoint.from_directory(d),
        checkpoint_dir_name=f"step={step}",
        checkpoint_upload_mode=mode,
        validation=step % int(config["validate_every"]) == 0,
    )
    if mode == train.CheckpointUploadMode.SYNC:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def _reported(
    config: dict[str, Any], rank: int, step: int, ckpt: str | None, mode: str, job: str | None
) -> None:
    """After a ``train.report`` returned on ``rank``: its marker and its ledger line."""
    _mark(config, rank, "step", step)
    _append(
        os.path.join(config["ledger_dir"], "ledger", f"{config['run']}.jsonl"),
        {
            "t": time.time(),
            "job": job,
            "run": config["run"],
            "rank": rank,
            "step": step,
            "ckpt": ckpt,
            "mode": mode,
            "attempt": train.get_context().get_attempt(),
            "pid": os.getpid(),
            "seen": _name_of(train.get_checkpoint()),
        },
    )


def ft_train_fn(config: dict[str, Any]) -> None:
    """``train_fn``'s run under ``TorchftConfig``: every rank is a torchft replica of one
    small model (the same batches: the replicas stay equal), ``config["steps"]``
    committed steps, one report per committed step, a checkpoint every ``ckpt_every``
    steps that rank 0 saves alone (``shard-0.pt`` holds the replicas' state: one shard),
    validated every ``validate_every``. A killed rank's replacement takes the state and
    the report count from a live peer; a restart of every rank (no live peer left, a
    driver killed) resumes from the checkpoint (``resume_from``). The same ledger and
    markers as ``train_fn``.
    """
    import torch

    from lumos.train.torch import prepare_torchft

    ctx = train.get_context()
    rank = ctx.get_world_rank()
    job_id = _ray_job_id()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, META)) as f:
                start = int(json.load(f)["step"])
            shard = torch.load(os.path.join(d, shard_name(0)), weights_only=True)
            if int(shard["step"]) != start:
                raise RuntimeError(f"the checkpoint of step {start} holds step {shard['step']}")
            model.load_state_dict(shard["model"])
    ft = prepare_torchft(model, optimizer)
    ft.resume_from(start)  # a replacement takes its peer's step at its first zero_grad
    _mark(config, rank, "step", start)
    steps = int(config["steps"])
    while ft.step < steps:
        ft.optimizer.zero_grad()
        g = torch.Generator().manual_seed(ft.step)
        x = torch.randn(32, 16, generator=g)
        loss = torch.nn.functional.mse_loss(ft.model(x), x.sum(dim=1, keepdim=True))
        _maybe_stall(config, "before_all_reduce")  # the others wait in torchft's all-reduce
        loss.backward()
        time.sleep(float(config["step_s"]))
        ft.optimizer.step()
        _maybe_stall(config, "after_all_reduce")  # ... in the next step's quorum
        if not ft.committed:
            continue  # repeated with the same batch
        step = ft.step
        metrics = {"step": step, "loss": float(loss.detach()), "attempt": ctx.get_attempt()}
        name = f"step={step}" if step % int(config["ckpt_every"]) == 0 else None
        if name is not None and rank == 0:
            d = tempfile.mkdtemp(prefix="soak-ckpt-")
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            state = {"step": step, "rank": 0, "model": model.state_dict(), "w": flat}
            torch.save(state, os.path.join(d, shard_name(0)))
            _report_checkpoint(config, rank, step, metrics, d, train.CheckpointUploadMode.SYNC)
        else:
            train.report(metrics)
        _reported(config, rank, step, name if rank == 0 else None, "sync", job_id)
    _mark(config, rank, "done", steps)


def _ray_job_id() -> str | None:
    import ray

    try:
        return str(ray.get_runtime_context().get_job_id())
    except Exception:  # not under Ray
        return None


def validate(
    checkpoint: Any, ledger_dir: str | None = None, sleep_s: float = 0.0
) -> dict[str, Any]:
    """Load every shard of ``checkpoint``; its step and the shards' mean weight.

    With ``ledger_dir`` it marks ``markers/<run>/validation.json`` while it runs, and it
    takes ``sleep_s`` longer (so a driver can be killed while one is in progress).
    """
    import torch

    path = str(checkpoint.path).rstrip("/")
    run, name = path.rsplit("/", 2)[-2:]
    marker = None
    if ledger_dir is not None:
        marker = os.path.join(ledger_dir, "markers", run, "validation.json")
        _write_json(
            marker, {"pid": os.getpid(), "ckpt": name, "doing": "validating", "t": time.time()}
        )
    time.sleep(sleep_s)
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, META)) as f:
            step = int(json.load(f)["step"])
        shards = sorted(n for n in os.listdir(d) if n.startswith("shard-"))
        values = [
            float(torch.load(os.path.join(d, n), weights_only=True)["w"].mean()) for n in shards
        ]
    if marker is not None:
        _write_json(
            marker, {"pid": os.getpid(), "ckpt": name, "doing": "validated", "t": time.time()}
        )
    return {
        "val_step": step,
        "val_loss": sum(values) / max(len(values), 1),
        "val_shards": len(shards),
    }


def trial_fn(config: dict[str, Any]) -> None:
    """A Tune trial: a 2-worker TorchTrainer run of ``train_fn`` in the trial's directory."""
    from lumos import tune
    from lumos.train.torch import TorchTrainer

    trial = tune.get_context().get_trial_name()
    ledger = os.path.join(config["ledger_dir"], "ledger", "trials.jsonl")
    _append(
        ledger,
        {
            "sweep": config["sweep"],
            "trial": trial,
            "event": "start",
            "pid": os.getpid(),
            "t": time.time(),
        },
    )
    loop = dict(config["loop"], run=f"{config['sweep']}-{trial}")
    loop["x"] = config["x"]
    trainer = TorchTrainer(
        train_fn,
        train_loop_config=loop,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            verbose=False,
            failure_config=train.FailureConfig(
                max_failures=-1,
                health_check_timeout_s=config["health_check_timeout_s"],
                hang_timeout_s=config.get("hang_timeout_s", 600.0),
            ),
            checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        ),
    )
    try:
        result = trainer.fit()
    except tune.TrialPruned:
        _append(
            ledger,
            {
                "sweep": config["sweep"],
                "trial": trial,
                "event": "pruned",
                "pid": os.getpid(),
                "t": time.time(),
            },
        )
        raise
    _append(
        ledger,
        {
            "sweep": config["sweep"],
            "trial": trial,
            "event": "end",
            "pid": os.getpid(),
            "t": time.time(),
            "metrics": result.metrics,
        },
    )
