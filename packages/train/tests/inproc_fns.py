"""Training functions that coordinate through in-process events (fake worker group only).

Kept apart from ``report_fns`` because that module is pickled by value for Ray, and
``threading.Event`` objects do not pickle.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from report_fns import FACTS, _write

from lumos import train

EVENTS: dict[str, threading.Event] = {}


def async_retention(config: dict[str, Any]) -> None:
    """One rank, ASYNC, num_to_keep=1: while epoch 2 uploads (held), epoch 1 commits and
    retention runs; record which directories exist then, then release the upload."""
    key = config["key"]
    release = EVENTS[key + ":release"]
    storage = train.get_context().get_storage()

    def held(ckpt: train.Checkpoint, dir_name: str) -> train.Checkpoint:
        storage.persist_directory(ckpt.path, dir_name)
        EVENTS[key + ":uploaded"].set()
        if not release.wait(60):
            raise TimeoutError("never released")
        return storage.checkpoint(dir_name)

    for epoch in range(3):
        d = _write(epoch)
        train.report(
            {"epoch": epoch},
            checkpoint=train.Checkpoint.from_directory(d),
            checkpoint_dir_name=f"epoch={epoch}",
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            checkpoint_upload_fn=held if epoch == 2 else None,
        )
    EVENTS[key + ":uploaded"].wait(60)
    while (c := train.get_checkpoint()) is None or not c.path.endswith("epoch=1"):
        time.sleep(0.01)  # the commit notice of epoch=1 arrives from the driver: poll
    FACTS[key + ":dirs"] = sorted(
        p.rsplit("/", 1)[-1] for p in storage.fs.ls(storage.run_path, detail=False)
    )
    release.set()
    FACTS[key + ":all"] = [
        (rc.checkpoint.path.rsplit("/", 1)[-1], rc.metrics["epoch"], rc.status.value)
        for rc in train.get_all_reported_checkpoints()
    ]
