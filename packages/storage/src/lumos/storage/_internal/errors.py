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
