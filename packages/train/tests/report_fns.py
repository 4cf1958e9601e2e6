"""Training functions for the reporting / upload-mode tests (shipped to Ray by value).

Functions that take ``config["key"]`` record facts in ``FACTS`` (in-process: the fake
worker group only); the others coordinate through files, so they run on Ray too.
Functions that wait on ``threading.Event``s live in ``inproc_fns.py``.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from typing import Any

from train_fns import wait_for_file

from lumos import train

# What in-process runs (the fake worker group) record for the test to check.
FACTS: dict[str, Any] = {}


def _rank() -> int:
    return train.get_context().get_world_rank()


def _write(step: int, name: str = "model.json") -> str:
    d = tempfile.mkdtemp(prefix="lumos-test-ckpt-")
    with open(os.path.join(d, name), "w") as f:
        json.dump({"step": step, "rank": _rank()}, f)
    return d


def _step_of(ckpt: train.Checkpoint | None) -> int | None:
    if ckpt is None:
        return None
    with ckpt.as_directory() as d, open(os.path.join(d, "model.json")) as f:
        return int(json.load(f)["step"])


def ray_docs_pattern(config: dict[str, Any]) -> None:
    """Every rank reports; only rank 0 passes a checkpoint, every rank the same name."""
    start = _step_of(train.get_checkpoint())
    first = 0 if start is None else start + 1
    mode = train.CheckpointUploadMode[config.get("mode", "SYNC")]
    for epoch in range(first, config["epochs"]):
        ckpt = train.Checkpoint.from_directory(_write(epoch)) if _rank() == 0 else None
        train.report(
            {"epoch": epoch, "start": first, "attempt": train.get_context().get_attempt()},
            checkpoint=ckpt,
            checkpoint_dir_name=f"epoch={epoch}",
            checkpoint_upload_mode=mode,
        )
    if config.get("out"):  # what get_checkpoint() says at the end, per rank
        with open(os.path.join(config["out"], f"latest_rank{_rank()}.json"), "w") as f:
            json.dump(_step_of(train.get_checkpoint()), f)


def raise_apart(config: dict[str, Any]) -> None:
    """Rank 0 raises; rank 1 raises 0.5 s after it (it waits for rank 0's marker file).

    Rank 0 raises only once rank 1 is past its report: the driver's stop request (sent
    at rank 0's error) must find rank 1 outside the lumos API, or its next call would
    end it with StopRequested instead of its own error.
    """
    train.report({"x": 1})
    marker = config["marker"]
    if _rank() == 0:
        wait_for_file(marker + ".rank1-reported")
        open(marker, "w").close()
        raise ValueError("rank 0 fails first")
    open(marker + ".rank1-reported", "w").close()
    wait_for_file(marker)
    time.sleep(0.5)  # the scenario: the second error comes 0.5 s later
    raise KeyError("rank 1 fails second")


def reuse_name(config: dict[str, Any]) -> None:
    """Commit "best", then report "best" again; record what report() raised."""
    train.report(
        {"v": 1}, checkpoint=train.Checkpoint.from_directory(_write(1)), checkpoint_dir_name="best"
    )
    try:
        train.report(
            {"v": 2},
            checkpoint=train.Checkpoint.from_directory(_write(2, "other.json")),
            checkpoint_dir_name="best",
        )
    except train.CheckpointReportError as exc:
        FACTS[f"{config['key']}:{_rank()}"] = str(exc)
        raise


def tensor_metrics(config: dict[str, Any]) -> None:
    import torch

    train.report({"loss": torch.tensor(0.5)})


def fine_tune(config: dict[str, Any]) -> None:
    """Record what get_checkpoint() returned per attempt; rank 1 SIGKILLs itself (or
    raises) at step ``die_at`` of attempt 0, after the run committed its own checkpoints."""
    ctx = train.get_context()
    ckpt = train.get_checkpoint()
    step = _step_of(ckpt)
    out = config["out"]
    with open(os.path.join(out, f"attempt{ctx.get_attempt()}_rank{_rank()}.json"), "w") as f:
        json.dump({"step": step, "path": None if ckpt is None else ckpt.path}, f)
    first = 0 if step is None or step < 0 else step + 1
    for s in range(first, config["steps"]):
        if ctx.get_attempt() == 0 and _rank() == 1 and s == config["die_at"]:
            if config.get("how") == "raise":
                raise ValueError("fine-tune: rank 1 fails")
            os.kill(os.getpid(), signal.SIGKILL)
        train.report(
            {"step": s, "first": first}, checkpoint=train.Checkpoint.from_directory(_write(s))
        )


def slow_upload_then_die(config: dict[str, Any]) -> None:
    """ASYNC: epoch 0 commits; rank 1's upload of epoch 1 writes half its files into the
    run and blocks (on a file never created); rank 1 then SIGKILLs itself (attempt 0)."""
    ctx = train.get_context()
    start = _step_of(train.get_checkpoint())
    first = 0 if start is None else start + 1
    half_written = threading.Event()

    def blocked_upload(ckpt: train.Checkpoint, dir_name: str) -> train.Checkpoint:
        storage = train.get_context().get_storage()
        dest = storage.checkpoint(dir_name)
        dest.filesystem.makedirs(dest.path, exist_ok=True)
        with dest.filesystem.open(f"{dest.path}/half_rank{_rank()}.bin", "wb") as f:
            f.write(b"x" * 1000)
        half_written.set()
        wait_for_file(config["never"], timeout_s=600)
        return dest

    for epoch in range(first, config["epochs"]):
        slow = ctx.get_attempt() == 0 and _rank() == 1 and epoch == 1
        train.report(
            {"epoch": epoch, "start": first},
            checkpoint=train.Checkpoint.from_directory(_write(epoch)),
            checkpoint_dir_name=f"epoch={epoch}",
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=blocked_upload if slow else None,
        )
        if ctx.get_attempt() == 0 and epoch == 0:
            train.get_all_reported_checkpoints()  # epoch=0 is committed on every rank
        if slow:
            half_written.wait(60)
            os.kill(os.getpid(), signal.SIGKILL)


def back_pressure(config: dict[str, Any]) -> None:
    """ASYNC reports whose uploads wait (bounded) for the report after next to return.

    Each upload records how many reports had returned when it finished. With
    back-pressure at most MAX_UPLOADS_IN_FLIGHT reports run ahead of the uploads.
    """
    key = config["key"]
    returned = [0]
    cond = threading.Condition()
    storage = train.get_context().get_storage()
    at_finish: list[int] = []

    def upload(ckpt: train.Checkpoint, dir_name: str) -> train.Checkpoint:
        i = int(dir_name.split("_")[1])
        with cond:  # wait (at most 0.3 s) for report i + 2 to return: it must not
            cond.wait_for(lambda: returned[0] >= i + 3, timeout=0.3)
            at_finish.append(returned[0])
        storage.persist_directory(ckpt.path, dir_name)
        return storage.checkpoint(dir_name)

    for i in range(config["n"]):
        train.report(
            {"i": i},
            checkpoint=train.Checkpoint.from_directory(_write(i)),
            checkpoint_dir_name=f"c_{i}",
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=upload,
        )
        with cond:
            returned[0] += 1
            cond.notify_all()
    train.get_all_reported_checkpoints()
    FACTS[key] = at_finish


def no_upload(config: dict[str, Any]) -> None:
    """Every rank writes its shard straight into <run>/<name> and registers it (NO_UPLOAD)."""
    storage = train.get_context().get_storage()
    for step in range(2):
        name = f"dcp_{step}"
        target = storage.checkpoint(name)
        target.filesystem.makedirs(target.path, exist_ok=True)
        with target.filesystem.open(f"{target.path}/shard_{_rank()}.json", "w") as f:
            json.dump({"step": step}, f)
        where = target if not config.get("wrong") else train.Checkpoint.from_directory(_write(step))
        train.report(
            {"step": step},
            checkpoint=where,
            checkpoint_dir_name=name,
            checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
        )


def upload_fn_modes(config: dict[str, Any]) -> None:
    """checkpoint_upload_fn copies the files itself (SYNC then ASYNC), marking them."""
    storage = train.get_context().get_storage()

    def my_upload(ckpt: train.Checkpoint, dir_name: str) -> train.Checkpoint:
        storage.persist_directory(ckpt.path, dir_name)
        dest = storage.checkpoint(dir_name)
        with dest.filesystem.open(f"{dest.path}/uploaded_by_{_rank()}.txt", "w") as f:
            f.write(dir_name)
        return dest if not config.get("wrong") else ckpt

    for step, mode in enumerate(["SYNC", "ASYNC"]):
        train.report(
            {"step": step},
            checkpoint=train.Checkpoint.from_directory(_write(step)),
            checkpoint_dir_name=f"fn_{mode.lower()}",
            checkpoint_upload_mode=train.CheckpointUploadMode[mode],
            checkpoint_upload_fn=my_upload,
        )


def async_temporary_directory(config: dict[str, Any]) -> None:
    """ASYNC from a TemporaryDirectory left right after report(): the snapshot is uploaded."""
    for step in range(config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "model.json"), "w") as f:
                json.dump({"step": step, "rank": _rank()}, f)
            train.report(
                {"step": step},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            )
    FACTS[config["key"]] = [
        (rc.checkpoint.path.rsplit("/", 1)[-1], rc.metrics["step"])
        for rc in train.get_all_reported_checkpoints()
    ]
