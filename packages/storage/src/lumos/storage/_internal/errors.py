"""Exceptions of lumos.storage: one base class and a few meaningful subclasses.

Every exception here pickles with its fields (``__reduce__``) so that it can
cross Ray processes unchanged.
"""

from __future__ import annotations

from typing import Any


class StorageError(Exception):
    """Base class of every error raised by ``lumos.storage``."""


class StorageUsageError(StorageError, ValueError):
    """A storage call was given a value it cannot accept (the message names it)."""


class InvalidNameError(StorageError, ValueError):
    """A run name or checkpoint directory name is not a safe single path component.

    Attributes:
        field: Which setting held the value (``"name"``, ``"checkpoint_dir_name"``, ...).
        value: The rejected value.
        reason: Why it was rejected.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(
            f"Invalid {field}={value!r}: {reason}. Allowed: a non-empty single path "
            "component of at most 255 characters without '/', '\\', '..', control "
            "characters or a leading '~', that is not the reserved name '_lumos' "
            "(for example 'run-42' or 'epoch=3')."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.reason))


class LeaseHeldError(StorageError):
    """Another live driver holds the lease of this run.

    Attributes:
        run: Where the run lives (its URI).
        holder: The holder's label.
        host: Host name of the holder.
        pid: Process id of the holder.
        expires_in_s: Seconds until the holder's lease expires if it stops renewing.
    """

    def __init__(
        self, run: str, holder: str, host: str, pid: int, expires_in_s: float, detail: str = ""
    ) -> None:
        self.run = run
        self.holder = holder
        self.host = host
        self.pid = pid
        self.expires_in_s = expires_in_s
        self.detail = detail
        message = detail or (
            f"Run {run!r} is in use by another live driver: holder={holder!r} "
            f"(host={host!r}, pid={pid}); its lease expires in {max(expires_in_s, 0.0):.1f}s "
            "unless renewed. Stop that driver, wait for it to finish, or choose another "
            "RunConfig(name=...) / storage_path."
        )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.run, self.holder, self.host, self.pid, self.expires_in_s, self.detail),
        )


class RunStateError(StorageError):
    """The run state file cannot be read: corrupt, invalid, or from a newer schema."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"Cannot read run state {path!r}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


class MissingBackendError(StorageError, ImportError):
    """The fsspec backend for a URL's protocol is not installed."""

    def __init__(self, protocol: str, message: str) -> None:
        self.protocol = protocol
        self.message = message
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.protocol, self.message))


class StorageIOError(StorageError, OSError):
    """A storage operation failed: a permanent error, or transient errors past the retry budget.

    Committed state is untouched: the operation either happened whole or not at all
    (a state write is one atomic put or rename).

    Attributes:
        operation: What was done (``"write"``, ``"read"``, ``"list"``, ``"rename"``, ...).
        path: Where.
        cause: The last underlying error (``"PermissionError: ..."``).
        transient: Whether that error was transient (then retries ran out).
        attempts: How many attempts were made.
        elapsed_s: Seconds from the first attempt to giving up.
        policy: The retry policy in force, as ``key=value`` pairs.
    """

    def __init__(
        self,
        operation: str,
        path: str,
        cause: str,
        *,
        transient: bool = False,
        attempts: int = 1,
        elapsed_s: float = 0.0,
        policy: str = "",
    ) -> None:
        self.operation = operation
        self.path = path
        self.cause = cause
        self.transient = transient
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.policy = policy
        if transient:
            why = (
                f"transient errors persisted through {attempts} attempts over {elapsed_s:.1f}s "
                f"(retry policy: {policy}; raise its limits with the LUMOS_STORAGE_RETRY "
                "environment variable or lumos.storage.set_retry_policy)"
            )
        else:
            why = (
                "a permanent error, not retried (check credentials and permissions, that the "
                "bucket and path exist, and the storage settings)"
            )
        super().__init__(f"Storage {operation} failed on {path!r}: {cause}; {why}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_io_error,
            (
                self.operation,
                self.path,
                self.cause,
                self.transient,
                self.attempts,
                self.elapsed_s,
                self.policy,
            ),
        )


def _rebuild_io_error(
    operation: str,
    path: str,
    cause: str,
    transient: bool,
    attempts: int,
    elapsed_s: float,
    policy: str,
) -> StorageIOError:
    return StorageIOError(
        operation,
        path,
        cause,
        transient=transient,
        attempts=attempts,
        elapsed_s=elapsed_s,
        policy=policy,
    )
