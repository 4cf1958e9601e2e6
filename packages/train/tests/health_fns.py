"""Training and validation functions for the validation and health-rollback tests.

Shipped to Ray workers by value (see conftest.py); they also run on the FakeCluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from typing import Any

from lumos import train


def _step_of(ckpt: train.Checkpoint) -> int:
    with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        return int(json.load(f)["step"])


def _save(step: int) -> train.Checkpoint:
    d = tempfile.mkdtemp(prefix="lumos-test-health-")
    rank = train.get_context().get_world_rank()
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    with open(os.path.join(d, f"shard_{rank}.txt"), "w") as f:
        f.write(f"rank {rank} step {step}")
    return train.Checkpoint.from_directory(d)


def _log(config: dict[str, Any], record: dict[str, Any]) -> None:
    if config.get("log") and train.get_context().get_world_rank() == 0:
        with open(config["log"], "a") as f:
            f.write(json.dumps(record) + "\n")


def read_log(path: str) -> list[dict[str, Any]]:
    """The records ``_log`` wrote (one per attempt start, and one per step)."""
    with open(path) as f:
        return [json.loads(line) for line in f]


def loop(config: dict[str, Any]) -> None:
    """Steps ``0 .. steps-1``; a checkpoint ``step={s}`` every ``every`` steps.

    ``loss`` is ``losses[step]`` when given, else ``1 / (step + 1)``; ``nan_at`` makes
    it NaN at that step unless the run was rolled back (the function then "skips the
    bad data", as a user would). ``validate`` passes ``validation=`` on checkpoints.
    ``step_s`` sleeps between steps; ``on_notice`` checkpoints at every step while a
    preemption notice is out (``train.get_preemption_info()``); ``wait_validated`` calls
    ``get_all_reported_checkpoints(VALIDATED)`` at the end and logs what it saw.
    """
    ckpt = train.get_checkpoint()
    start = _step_of(ckpt) + 1 if ckpt is not None else 0
    ctx = train.get_context()
    info = ctx.get_rollback_info()
    _log(
        config,
        {
            "start": start,
            "attempt": ctx.get_attempt(),
            "pid": os.getpid(),
            "size": ctx.get_world_size(),
            "info": dataclasses.asdict(info) if info is not None else None,
        },
    )
    every = config.get("every", 1)
    until = config.get("until")  # go on past ``steps`` until this file exists (bounded)
    step = start - 1
    while True:
        step += 1
        if step >= config["steps"] and not (until and not os.path.exists(until)):
            break
        assert step < 100_000, "loop: the `until` file never appeared"
        if config.get("step_s"):
            time.sleep(config["step_s"])
        losses = config.get("losses")
        loss = losses[step] if losses else 1.0 / (step + 1)
        if step == config.get("nan_at") and info is None:
            loss = math.nan
        # a well-behaved loop checkpoints at once when a preemption notice comes
        notice = config.get("on_notice") and train.get_preemption_info() is not None
        checkpoint = _save(step) if step % every == every - 1 or notice else None
        validation = config.get("validate", False) if checkpoint is not None else False
        if isinstance(validation, dict):
            validation = train.ValidationTaskConfig(**validation)
        _log(config, {"step": step})
        train.report(
            {"step": step, "loss": loss},
            checkpoint=checkpoint,
            checkpoint_dir_name=f"step={step}" if checkpoint is not None else None,
            validation=validation,
        )
    if config.get("wait_validated"):
        seen = train.get_all_reported_checkpoints(train.CheckpointConsistencyMode.VALIDATED)
        _log(config, {"seen": [[rc.metrics, rc.status.value] for rc in seen]})


def validate(
    checkpoint: train.Checkpoint,
    scale: float = 1.0,
    sleep_s: float = 0.0,
    fail_step: int | None = None,
    slow_step: int | None = None,
) -> dict[str, Any]:
    """``val_loss = scale * |step - 2|``: best at step 2 (so not the latest)."""
    step = _step_of(checkpoint)
    if step == fail_step:
        raise ValueError(f"validation cannot load step {step}")
    if sleep_s and (slow_step is None or step == slow_step):
        time.sleep(sleep_s)
    return {"val_loss": scale * abs(step - 2), "val_step": step}


def validate_slowly_until(checkpoint: train.Checkpoint, until: str) -> dict[str, Any]:
    """Blocks until the file ``until`` exists (the test kills the driver meanwhile)."""
    deadline = time.monotonic() + 300
    while not os.path.exists(until):
        assert time.monotonic() < deadline, "validate_slowly_until: file never appeared"
        time.sleep(0.05)
    return validate(checkpoint)


def val_spike(report: train.HealthReport, history: Any) -> train.Rollback | None:
    """A custom check on validations: roll back to ``step=1`` when val_step is 4."""
    if report.source == "validation" and report.metrics.get("val_step") == 4:
        return train.Rollback("val_step 4 is bad", to_checkpoint="step=1")
    return None


def same_run(config: dict[str, Any]) -> None:
    """A run both backends must store alike (``test_same_run_on_both_backends.py``).

    Steps ``0 .. steps-1``, a checkpoint ``step={s}`` at each (SYNC on even steps, ASYNC
    on odd ones), a validation for the steps in ``validate``; ``loss`` is NaN at
    ``nan_at`` unless the run already rolled back for it. At the end the function waits
    for every validation (``get_all_reported_checkpoints(VALIDATED)``).
    """
    ckpt = train.get_checkpoint()
    start = _step_of(ckpt) + 1 if ckpt is not None else 0
    info = train.get_context().get_rollback_info()
    for step in range(start, config["steps"]):
        nan = step == config.get("nan_at") and (info is None or "NonFinite" not in info.check)
        mode = train.CheckpointUploadMode.ASYNC if step % 2 else train.CheckpointUploadMode.SYNC
        train.report(
            {"step": step, "loss": math.nan if nan else 1.0 / (step + 1)},
            checkpoint=_save(step),
            checkpoint_dir_name=f"step={step}",
            checkpoint_upload_mode=mode,
            validation=step in config.get("validate", ()),
        )
    train.get_all_reported_checkpoints(train.CheckpointConsistencyMode.VALIDATED)
