"""A user module whose import takes seconds (like ``import torch`` on a busy machine).

Imported only by the test that needs it: its import sleeps ``IMPORT_S``.
"""

from __future__ import annotations

import time

from lumos.runtime import worker

IMPORT_S = 6.0
time.sleep(IMPORT_S)


def report_once() -> str:
    """Report once, then return."""
    session = worker.get_session()
    assert session is not None
    session.emit({"imported": True})
    return "done"
