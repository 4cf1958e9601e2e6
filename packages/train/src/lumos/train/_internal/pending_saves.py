"""Checkpoint directories whose files a background save is still writing.

``save_sharded_state(..., async_save=True)`` returns as soon as DCP staged the state
(copied it off the live tensors) and registers the directory here with a ``wait``
callable. ``train.report`` then finds it:

* ASYNC: the upload thread waits for the save, then uploads the directory; ``report()``
  itself does not wait, and no hard-link snapshot is taken (the files do not exist yet);
* SYNC / NO_UPLOAD: ``report()`` waits for the save before it persists or registers.

The checkpoint commits only once every rank's upload finished (the ordinary commit
rule), so a rank killed while its save runs leaves an uncommitted directory that the
next restore cleans up, never a half checkpoint.

This module holds no torch: it is what ``reporting.py`` needs and nothing more.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from lumos.train._internal.errors import CheckpointReportError

WaitFn = Callable[[float | None], bool]
"""``wait(timeout_s)``: True once the save finished, False on timeout; raises its error."""

_LOCK = threading.Lock()
_PENDING: dict[str, WaitFn] = {}


def _key(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def register(path: str, wait: WaitFn) -> None:
    """Note that a background save is writing into ``path`` (a local directory)."""
    with _LOCK:
        _PENDING[_key(path)] = wait


def take(path: str) -> WaitFn | None:
    """The ``wait`` of the save writing into ``path`` (forgotten here), or None."""
    with _LOCK:
        return _PENDING.pop(_key(path), None)


def wait_now(path: str) -> None:
    """Block until the save writing into ``path`` (if any) finished; raise its error."""
    wait = take(path)
    if wait is not None:
        wait(None)


def upload_after_save(
    wait: WaitFn, upload: Callable[[], None], dir_name: str, cancelled: Callable[[], bool]
) -> Callable[[], None]:
    """An upload job that first waits for the save (checking ``cancelled``), then uploads."""

    def run() -> None:
        while not wait(0.2):
            if cancelled():
                raise CheckpointReportError(
                    f"upload of {dir_name!r} cancelled while its sharded save was running"
                )
        if cancelled():
            raise CheckpointReportError(f"upload of {dir_name!r} cancelled")
        upload()

    return run
