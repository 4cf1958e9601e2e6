"""Train functions for ``test_tune_over_train.py`` (imported by name on Train workers)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

from lumos import train

STEP_FILE = "s.json"


def _passed(gate: str, step: int, trials: int) -> None:
    """Mark this trial as past ``step``; wait (bounded) until ``trials`` trials are."""
    name = train.get_context().get_trial_name()
    open(os.path.join(gate, f"{step:03d}-{name}"), "w").close()
    deadline = time.monotonic() + 120
    while sum(f.startswith(f"{step:03d}-") for f in os.listdir(gate)) < trials:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all trials passed step {step} within 120 s")
        time.sleep(0.02)  # the other trials' files: nothing to wait on


def learner(config: dict[str, Any]) -> None:
    """``config["steps"]`` steps of ``score += lr``, a checkpoint ``step=<n>`` after each.

    Reports the trial it runs in (``get_trial_id`` / ``get_trial_name``), where this
    attempt started (``resumed_from``: the checkpoint's step, 0 when fresh) and the
    ``lr`` it used. With ``config["gate"]`` the trials run in lock step.
    """
    ctx = train.get_context()
    score, start = 0.0, 0
    if (ckpt := train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, STEP_FILE)) as f:
            score, start = json.load(f)
    gate = config.get("gate")
    for step in range(start + 1, int(config["steps"]) + 1):
        if gate:
            _passed(gate, step - 1, int(config["trials"]))
        score += float(config["lr"])
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, STEP_FILE), "w") as f:
                json.dump([score, step], f)
            train.report(
                {
                    "step": step,
                    "score": score,
                    "lr": float(config["lr"]),
                    "resumed_from": start,
                    "trial_id": ctx.get_trial_id(),
                    "trial_name": ctx.get_trial_name(),
                    "trial_dir": ctx.get_trial_dir(),
                },
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"step={step}",
            )
