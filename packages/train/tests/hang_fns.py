"""Training functions of the hang watchdog's tests: a rank stalls once, the run resumes."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from lumos import train


def _deadlock() -> None:
    """This thread and a helper each take one lock, then wait for the other's."""
    a, b = threading.Lock(), threading.Lock()
    held = threading.Barrier(2)

    def other() -> None:
        with b:
            held.wait()
            with a:
                pass

    threading.Thread(target=other, daemon=True, name="lock-b-holder").start()
    with a:
        held.wait()
        with b:
            pass


def _endless_loop() -> None:
    x = 0
    while True:
        x += 1


def stall(how: str) -> None:
    """Stop making progress the way ``how`` says."""
    if how == "sleep":
        time.sleep(3600)
    elif how == "loop":
        _endless_loop()
    elif how == "deadlock":
        _deadlock()
    raise AssertionError(f"unknown stall {how!r}")


def allreduce_loop(config: dict[str, Any]) -> None:
    """All-reduce every step; rank ``culprit`` stalls before step ``at``'s all-reduce
    in the first attempt only (``marker``: a file made when it stalls)."""
    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    ckpt = train.get_checkpoint()
    start = 0
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        if (
            rank == config["culprit"]
            and step == config["at"]
            and not os.path.exists(config["marker"])
        ):
            open(config["marker"], "w").close()
            stall(config["how"])
        t = torch.ones(1)
        dist.all_reduce(t)
        time.sleep(config.get("step_s", 0.0))
        checkpoint = None
        if rank == 0:
            d = os.path.join(config["tmp"], f"ckpt-{step}-{time.monotonic_ns()}")
            os.makedirs(d)
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            checkpoint = train.Checkpoint.from_directory(d)
        train.report({"step": step, "sum": t.item(), "start": start}, checkpoint=checkpoint)


class _SlowFile:
    """A file whose writes take ``delay_s`` in all (a big ``torch.save`` to slow storage)."""

    def __init__(self, path: str, delay_s: float) -> None:
        self._f = open(path, "wb")
        self._delay_s = delay_s

    def write(self, data: bytes) -> int:
        if self._delay_s > 0:
            time.sleep(self._delay_s)
            self._delay_s = 0.0
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def slow_but_alive_loop(config: dict[str, Any]) -> None:
    """Rank 0 takes ``wait_s`` (longer than the hang timeout) for each of: a slow import,
    a ``torch.save``, a SYNC checkpoint upload; rank 1 waits in an all-reduce meanwhile."""
    import importlib
    import sys

    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    wait_s = config["wait_s"]
    for step in range(4):
        if rank == 0 and step == 1:  # a slow import
            sys.path.insert(0, config["tmp"])
            importlib.import_module("slow_module")
        if rank == 0 and step == 2:  # a big torch.save
            f = _SlowFile(os.path.join(config["tmp"], "big.pt"), wait_s)
            torch.save({"w": torch.zeros(10)}, f)  # type: ignore[arg-type]
            f.close()
        dist.all_reduce(torch.ones(1))
        checkpoint, upload = None, None
        if rank == 0 and step == 3:  # a long checkpoint upload
            d = os.path.join(config["tmp"], "ckpt")
            os.makedirs(d, exist_ok=True)
            checkpoint = train.Checkpoint.from_directory(d)

            def upload(ckpt: train.Checkpoint, dir_name: str) -> train.Checkpoint:
                time.sleep(wait_s)
                storage = train.get_context().get_storage()
                with ckpt.as_directory() as local:
                    storage.persist_directory(local, dir_name)
                return storage.checkpoint(dir_name)

        train.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_fn=upload)
