"""Retries of storage I/O: which errors are transient, and the one bounded back-off policy.

Every storage call of lumos-storage that the train and tune packages use goes
through ``retry_call`` (directly or via the helpers in ``filesystem.py``). A
transient error (throttling, connection reset, HTTP 5xx, timeout) is retried with
full-jitter exponential back-off, capped in attempts and in total time; anything
else (a full disk, ``ENOSPC``, included), or a transient error past the budget, raises
``StorageIOError`` naming the operation, the path and the cause. The other packages
reach this through the ``retried_*`` helpers of ``retried.py``.
"""

from __future__ import annotations

import errno
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import TypeVar

from lumos.storage._internal.errors import StorageError, StorageIOError

T = TypeVar("T")

RETRY_ENV = "LUMOS_STORAGE_RETRY"
"""Environment variable with a JSON object of ``RetryPolicy`` fields (read at import)."""

# errno values of transient failures: the network, the server asking to slow down
# (s3fs maps SlowDown/503 to EBUSY, InternalError/500 to EREMOTEIO, unknown codes to EIO).
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNABORTED",
        "ECONNREFUSED",
        "ETIMEDOUT",
        "EAGAIN",
        "EBUSY",
        "EIO",
        "EREMOTEIO",
        "EPIPE",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "EINTR",
    )
    if hasattr(errno, name)
)

# errno values that no retry fixes, whatever else the error says: a full disk or quota,
# a read-only filesystem, a file past the size limit. ENOSPC's StorageIOError says so.
_PERMANENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG") if hasattr(errno, name)
)

_DISK_FULL_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT") if hasattr(errno, name)
)

_PERMANENT_TYPES: tuple[type[BaseException], ...] = (
    PermissionError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    StorageError,
    ValueError,
    TypeError,
)

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequests",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)

# Transport errors of botocore/aiobotocore/aiohttp/urllib3/requests that are not
# OSError subclasses; matched by class name so that none of them must be installed.
_TRANSIENT_NAME_PARTS = ("Connection", "Timeout", "Endpoint", "Disconnected", "IncompleteRead")
_TRANSIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "http")


def _client_error_transient(exc: BaseException) -> bool | None:
    """For an error carrying an HTTP response (botocore ``ClientError``): transient or not."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    code = str(error.get("Code", "")) if isinstance(error, dict) else ""
    meta = response.get("ResponseMetadata") or {}
    status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
    if code in _THROTTLE_CODES:
        return True
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if code.isdigit():
        return int(code) >= 500 or int(code) in (408, 429)
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: throttling, a connection problem, HTTP 5xx, a timeout.

    Permission errors, missing files or buckets, invalid requests and other 4xx
    answers are permanent.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _transient_one(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def _transient_one(exc: BaseException) -> bool | None:
    """True/False when ``exc`` alone decides; None to look at its cause."""
    by_response = _client_error_transient(exc)
    if by_response is not None:
        return by_response
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if isinstance(exc, OSError):
        if exc.errno in _TRANSIENT_ERRNOS:
            return True
        if exc.errno is not None:
            return False
        return None
    module = type(exc).__module__.split(".", 1)[0]
    if module in _TRANSIENT_MODULES:
        names = [c.__name__ for c in type(exc).__mro__]
        if any(part in name for name in names for part in _TRANSIENT_NAME_PARTS):
            return True
    return None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential back-off with full jitter for transient storage errors.

    Attempt ``n`` (from 1) that fails transiently waits a random time in
    ``[0, min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))]`` before the
    next, unless ``max_attempts`` were made or the next wait would end past
    ``max_total_s`` from the first attempt.

    The policy in force is ``get_retry_policy()``: these defaults, overridden by the
    ``LUMOS_STORAGE_RETRY`` environment variable (a JSON object of these fields, read at
    import, so Ray workers started with it agree) and by ``set_retry_policy``.

    Args:
        max_attempts: Attempts in all (1 disables retries).
        initial_backoff_s: Upper bound of the first wait.
        max_backoff_s: Upper bound of any wait.
        multiplier: Growth of the bound per attempt.
        max_total_s: No retry starts later than this after the first attempt.

    Raises:
        ValueError: A field is out of range (the message names it).
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    max_total_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ValueError(f"RetryPolicy.max_attempts={self.max_attempts!r} must be an int >= 1")
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts={self.max_attempts!r} must be >= 1")
        for name in ("initial_backoff_s", "max_backoff_s", "max_total_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"RetryPolicy.{name}={value!r} must be a number >= 0")
        if (
            isinstance(self.multiplier, bool)
            or not isinstance(self.multiplier, (int, float))
            or self.multiplier < 1
        ):
            raise ValueError(f"RetryPolicy.multiplier={self.multiplier!r} must be a number >= 1")

    def backoff_bound_s(self, attempt: int) -> float:
        """The largest wait after failed attempt ``attempt`` (1-based)."""
        bound = self.initial_backoff_s * self.multiplier ** max(attempt - 1, 0)
        return float(min(self.max_backoff_s, bound))

    def describe(self) -> str:
        """The fields as ``key=value`` pairs, for error messages."""
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def _policy_from_env() -> RetryPolicy:
    raw = os.environ.get(RETRY_ENV)
    if not raw:
        return RetryPolicy()
    try:
        loaded = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{RETRY_ENV}={raw!r} is not a JSON object ({exc})") from exc
    allowed = {f.name for f in fields(RetryPolicy)}
    if not isinstance(loaded, dict) or set(loaded) - allowed:
        raise ValueError(
            f"{RETRY_ENV}={raw!r} must be a JSON object with keys among {sorted(allowed)}"
        )
    return RetryPolicy(**loaded)


_policy = _policy_from_env()
_sleep: Callable[[float], None] = time.sleep
_rng = random.Random()


def get_retry_policy() -> RetryPolicy:
    """The retry policy in force in this process."""
    return _policy


def set_retry_policy(policy: RetryPolicy) -> RetryPolicy:
    """Use ``policy`` for every storage call of this process; returns the previous one."""
    global _policy
    if not isinstance(policy, RetryPolicy):
        raise TypeError(f"policy must be a RetryPolicy, got {type(policy).__name__}")
    previous, _policy = _policy, policy
    return previous


def _errno_in_chain(exc: BaseException, wanted: frozenset[int]) -> int | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in wanted:
            return current.errno
        current = current.__cause__ or current.__context__
    return None


def describe_cause(exc: BaseException) -> str:
    """``exc`` for a ``StorageIOError``'s cause: its type and message, plus what a full
    disk (``ENOSPC``, ``EDQUOT``) means."""
    text = f"{type(exc).__name__}: {exc}"
    code = _errno_in_chain(exc, _DISK_FULL_ERRNOS)
    if code is not None:
        name = errno.errorcode.get(code, str(code))
        text += (
            f" ({name}: no space left on device: the disk or quota is full; free space there "
            "or point the storage path at a volume with room)"
        )
    return text


def retry_call(
    operation: str,
    path: str,
    fn: Callable[[], T],
    *,
    passthrough: tuple[type[BaseException], ...] = (),
    policy: RetryPolicy | None = None,
) -> T:
    """Call ``fn`` (a whole idempotent operation), retrying transient errors.

    Args:
        operation: What is done, for messages (``"write"``, ``"list"``, ...).
        path: Where, for messages.
        fn: The operation; must be safe to run again after a failure.
        passthrough: Exceptions re-raised unchanged (the caller handles them,
            e.g. ``FileNotFoundError`` where missing is fine).
        policy: Use this instead of ``get_retry_policy()``.

    Raises:
        StorageIOError: A permanent error, or transient errors past the policy's budget.
    """
    pol = policy or _policy
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except passthrough:
            raise
        except StorageError:
            raise
        except Exception as exc:
            transient = is_transient(exc)
            if transient and attempt < pol.max_attempts:
                wait = _rng.uniform(0.0, pol.backoff_bound_s(attempt))
                if time.monotonic() - start + wait <= pol.max_total_s:
                    _sleep(wait)
                    continue
            raise StorageIOError(
                operation,
                path,
                describe_cause(exc),
                transient=transient,
                attempts=attempt,
                elapsed_s=time.monotonic() - start,
                policy=pol.describe(),
            ) from exc
