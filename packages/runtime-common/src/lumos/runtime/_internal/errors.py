"""Exceptions of lumos.runtime (all of them pickle, so they cross Ray processes)."""

from __future__ import annotations

import pickle
import traceback as _tb
from typing import Any


class LumosRuntimeError(Exception):
    """Base exception of ``lumos.runtime``: every error the runtime raises is one.

    Misuse raises a subclass that is also the matching builtin:
    ``RuntimeConfigError`` (a ``ValueError``) and ``RuntimeUsageError`` (a ``TypeError``).
    """


class RuntimeConfigError(LumosRuntimeError, ValueError):
    """An invalid argument or setting; the message names the field, the value and what is allowed.

    It is a ``ValueError`` too, so ``except ValueError`` still catches it.
    """


class RuntimeUsageError(LumosRuntimeError, TypeError):
    """An argument of the wrong type (e.g. not a ``JobContext``); the message names it.

    It is a ``TypeError`` too, so ``except TypeError`` still catches it.
    """


class WorkerGroupStartError(LumosRuntimeError):
    """A worker group (placement group + actors) could not be started.

    Everything that was already created has been released when this is raised.
    """


class StopRequested(LumosRuntimeError):
    """Raised in a worker's user thread when the owner asked the job to stop.

    A user function that ends by raising it finishes as
    ``FinishedEvent(stopped=True)`` rather than as an error.
    """


def _dumps_or_none(obj: BaseException | None) -> bytes | None:
    if obj is None:
        return None
    try:
        return pickle.dumps(obj)
    except Exception:
        try:
            from ray import cloudpickle

            return bytes(cloudpickle.dumps(obj))  # type: ignore[no-untyped-call]
        except Exception:
            return None


def _loads_or_none(data: bytes | None) -> BaseException | None:
    if data is None:
        return None
    try:
        obj = pickle.loads(data)
    except Exception:
        return None
    return obj if isinstance(obj, BaseException) else None


def _rebuild_remote_error(
    exc_type: str, message: str, traceback: str, cause: bytes | None, rank: int | None
) -> RemoteError:
    return RemoteError(exc_type, message, traceback, cause=_loads_or_none(cause), rank=rank)


class RemoteError(LumosRuntimeError):
    """An exception raised in a worker process, with its full remote traceback.

    Attributes:
        exc_type: Qualified name of the original exception type, e.g. ``"builtins.ValueError"``.
        message: ``str()`` of the original exception.
        traceback: The formatted remote traceback (all frames, chained causes included).
        cause: The original exception object when it could be pickled and unpickled
            in this process, else ``None``.
        rank: World rank (or pool worker id) of the worker that raised, when known.

    Example:
        >>> err = RemoteError.from_exception(ValueError("bad lr"), rank=1)
        >>> err.exc_type, err.message
        ('builtins.ValueError', 'bad lr')
    """

    def __init__(
        self,
        exc_type: str,
        message: str,
        traceback: str,
        *,
        cause: BaseException | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(exc_type, message)
        self.exc_type = exc_type
        self.message = message
        self.traceback = traceback
        self.cause = cause
        self.rank = rank

    @classmethod
    def from_exception(cls, exc: BaseException, rank: int | None = None) -> RemoteError:
        """Capture ``exc`` (with its traceback) as a picklable RemoteError."""
        tp = type(exc)
        name = f"{tp.__module__}.{tp.__qualname__}"
        text = "".join(_tb.format_exception(tp, exc, exc.__traceback__))
        cause = exc if _dumps_or_none(exc) is not None else None
        return cls(name, str(exc), text, cause=cause, rank=rank)

    def with_rank(self, rank: int) -> RemoteError:
        """A copy of this error attributed to ``rank``."""
        return RemoteError(self.exc_type, self.message, self.traceback, cause=self.cause, rank=rank)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_remote_error,
            (self.exc_type, self.message, self.traceback, _dumps_or_none(self.cause), self.rank),
        )

    def __str__(self) -> str:
        where = f" on rank {self.rank}" if self.rank is not None else ""
        head = f"{self.exc_type}: {self.message} (raised{where} in a worker)"
        return f"{head}\n\nRemote traceback:\n{self.traceback.rstrip()}"

    def __repr__(self) -> str:
        return (
            f"RemoteError(exc_type={self.exc_type!r}, message={self.message!r}, rank={self.rank!r})"
        )


class WorkerGroupError(LumosRuntimeError):
    """One or more workers failed while executing a function; holds every rank's error.

    Attributes:
        errors: ``{rank: RemoteError}`` for every rank that failed.
    """

    def __init__(self, errors: dict[int, RemoteError], message: str | None = None) -> None:
        self.errors = dict(sorted(errors.items()))
        ranks = ", ".join(str(r) for r in self.errors)
        self._message = message or f"{len(self.errors)} worker(s) failed (ranks {ranks})"
        super().__init__(self._message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerGroupError, (self.errors, self._message))

    def __str__(self) -> str:
        parts = [self._message]
        for rank, err in self.errors.items():
            parts.append(f"--- rank {rank} ---\n{err}")
        return "\n".join(parts)
