"""Worker side of lumos.runtime: the session a user function talks to.

Example:
    >>> from lumos.runtime import worker
    >>> def train_fn():
    ...     session = worker.get_session()
    ...     session.emit({"loss": 0.1})
    ...     if session.stop_requested:
    ...         return
"""

from __future__ import annotations

from lumos.runtime._internal.errors import StopRequested
from lumos.runtime._internal.session import WorkerInfo, WorkerSession, get_session

__all__ = ["StopRequested", "WorkerInfo", "WorkerSession", "get_session"]
