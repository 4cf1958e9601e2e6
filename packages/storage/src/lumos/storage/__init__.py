"""lumos.storage: crash-safe run storage and checkpoints on any fsspec filesystem.

Example:
    >>> from lumos.storage import RunStorage, RunState, CheckpointRecord
    >>> storage = RunStorage("memory://runs", "run-42")
    >>> state = RunState(name="run-42")
    >>> storage.save_state(state)
    >>> storage.load_state().name
    'run-42'
"""

from __future__ import annotations

from lumos.storage._internal.checkpoint import Checkpoint
from lumos.storage._internal.errors import (
    InvalidNameError,
    LeaseHeldError,
    MissingBackendError,
    RunStateError,
    StorageError,
)
from lumos.storage._internal.filesystem import resolve_filesystem
from lumos.storage._internal.lease import Lease
from lumos.storage._internal.names import validate_name
from lumos.storage._internal.retention import CheckpointConfig, RetentionPolicy
from lumos.storage._internal.run_storage import RunStorage
from lumos.storage._internal.state import AttemptRecord, CheckpointRecord, RunState
from lumos.storage._version import __version__

__all__ = [
    "AttemptRecord",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointRecord",
    "InvalidNameError",
    "Lease",
    "LeaseHeldError",
    "MissingBackendError",
    "RetentionPolicy",
    "RunState",
    "RunStateError",
    "RunStorage",
    "StorageError",
    "__version__",
    "resolve_filesystem",
    "validate_name",
]
