"""A run that can be held at each phase boundary, for the resume-at-every-phase tests.

``phase_run(config)``: 2 ranks report steps ``1..4``, each with a sharded checkpoint
and a validation; every start of the function appends a line to ``config["starts"]``.
``config["hold"]`` names the phase at which the run waits while the file
``config["gate"]`` exists: ``"training"`` (rank 0 before step 3),
``"after_last_report"`` (rank 0 after its last report), ``"validation"`` (the last
checkpoint's validation). ``validate`` merges ``val_loss``.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from lumos import train

STEPS = 4


def _wait_while(path: str | None, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def phase_run(config: dict[str, Any]) -> None:
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    if rank == 0:
        with open(config["starts"], "a", encoding="utf-8") as f:
            f.write("start\n")
    start = 1
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            start = int(open(os.path.join(d, f"step-{rank}")).read()) + 1
    for step in range(start, STEPS + 1):
        if rank == 0 and step == 3 and config.get("hold") == "training":
            _wait_while(config.get("gate"))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"step-{rank}"), "w", encoding="utf-8") as f:
                f.write(str(step))
            train.report(
                {"step": step, "loss": 1.0 / step},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"ckpt-{step}",
                validation=True,
            )
    if rank == 0 and config.get("hold") == "after_last_report":
        _wait_while(config.get("gate"))


def validate(checkpoint: Any, gate: str | None = None, hold: str | None = None) -> dict[str, Any]:
    with checkpoint.as_directory() as d:
        step = int(open(os.path.join(d, "step-0")).read())
    if hold == "validation" and step == STEPS:
        _wait_while(gate)
    return {"val_loss": 0.5 / step}
