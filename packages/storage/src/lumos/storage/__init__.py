"""lumos.storage: crash-safe run storage and checkpoints on any fsspec filesystem.

Names are loaded on first use (PEP 562).

Example:
    >>> from lumos.storage import RunStorage, RunState, CheckpointRecord
    >>> storage = RunStorage("memory://runs", "run-42")
    >>> state = RunState(name="run-42")
    >>> storage.save_state(state)
    >>> storage.load_state().name
    'run-42'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.storage._internal.lazy import lazy_attributes as lazy_attributes
from lumos.storage._version import __version__

if TYPE_CHECKING:
    from lumos.storage._internal.attempt_records import (
        FailureRecord as FailureRecord,
        WorkerRecord as WorkerRecord,
    )
    from lumos.storage._internal.checkpoint import (
        Checkpoint as Checkpoint,
    )
    from lumos.storage._internal.checkpoint_log import (
        DeletedCheckpoint as DeletedCheckpoint,
    )
    from lumos.storage._internal.errors import (
        InvalidNameError as InvalidNameError,
        LeaseHeldError as LeaseHeldError,
        MissingBackendError as MissingBackendError,
        RunStateError as RunStateError,
        StorageError as StorageError,
        StorageIOError as StorageIOError,
        StorageUsageError as StorageUsageError,
    )
    from lumos.storage._internal.filesystem import (
        is_local as is_local,
        resolve_filesystem as resolve_filesystem,
    )
    from lumos.storage._internal.jsonable import (
        json_default as json_default,
        to_jsonable as to_jsonable,
    )
    from lumos.storage._internal.lease import (
        Lease as Lease,
    )
    from lumos.storage._internal.names import (
        validate_name as validate_name,
    )
    from lumos.storage._internal.retention import (
        CheckpointConfig as CheckpointConfig,
        RetentionPolicy as RetentionPolicy,
    )
    from lumos.storage._internal.retried import (
        AppendOnlyFile as AppendOnlyFile,
        retried_copy_tree as retried_copy_tree,
        retried_download as retried_download,
        retried_exists as retried_exists,
        retried_find as retried_find,
        retried_isdir as retried_isdir,
        retried_ls as retried_ls,
        retried_makedirs as retried_makedirs,
        retried_put_file as retried_put_file,
        retried_read as retried_read,
        retried_rm as retried_rm,
        retried_write as retried_write,
    )
    from lumos.storage._internal.retry import (
        RetryPolicy as RetryPolicy,
        get_retry_policy as get_retry_policy,
        is_transient as is_transient,
        retry_call as retry_call,
        set_retry_policy as set_retry_policy,
    )
    from lumos.storage._internal.run_storage import (
        RunStorage as RunStorage,
    )
    from lumos.storage._internal.state import (
        AttemptRecord as AttemptRecord,
        CheckpointRecord as CheckpointRecord,
        RollbackRecord as RollbackRecord,
        RunState as RunState,
    )

_ERRORS = "lumos.storage._internal.errors"
_FILESYSTEM = "lumos.storage._internal.filesystem"
_JSONABLE = "lumos.storage._internal.jsonable"
_RETENTION = "lumos.storage._internal.retention"
_RETRIED = "lumos.storage._internal.retried"
_RETRY = "lumos.storage._internal.retry"
_STATE = "lumos.storage._internal.state"

_LAZY: dict[str, str] = {
    "FailureRecord": "lumos.storage._internal.attempt_records",
    "WorkerRecord": "lumos.storage._internal.attempt_records",
    "Checkpoint": "lumos.storage._internal.checkpoint",
    "DeletedCheckpoint": "lumos.storage._internal.checkpoint_log",
    "InvalidNameError": _ERRORS,
    "LeaseHeldError": _ERRORS,
    "MissingBackendError": _ERRORS,
    "RunStateError": _ERRORS,
    "StorageError": _ERRORS,
    "StorageIOError": _ERRORS,
    "StorageUsageError": _ERRORS,
    "is_local": _FILESYSTEM,
    "resolve_filesystem": _FILESYSTEM,
    "json_default": _JSONABLE,
    "to_jsonable": _JSONABLE,
    "Lease": "lumos.storage._internal.lease",
    "validate_name": "lumos.storage._internal.names",
    "CheckpointConfig": _RETENTION,
    "RetentionPolicy": _RETENTION,
    "AppendOnlyFile": _RETRIED,
    "retried_copy_tree": _RETRIED,
    "retried_download": _RETRIED,
    "retried_exists": _RETRIED,
    "retried_find": _RETRIED,
    "retried_isdir": _RETRIED,
    "retried_ls": _RETRIED,
    "retried_makedirs": _RETRIED,
    "retried_put_file": _RETRIED,
    "retried_read": _RETRIED,
    "retried_rm": _RETRIED,
    "retried_write": _RETRIED,
    "RetryPolicy": _RETRY,
    "get_retry_policy": _RETRY,
    "is_transient": _RETRY,
    "retry_call": _RETRY,
    "set_retry_policy": _RETRY,
    "RunStorage": "lumos.storage._internal.run_storage",
    "AttemptRecord": _STATE,
    "CheckpointRecord": _STATE,
    "RollbackRecord": _STATE,
    "RunState": _STATE,
}

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.storage", _LAZY, globals(), eager=("__version__", "lazy_attributes")
)
