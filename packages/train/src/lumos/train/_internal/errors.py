"""Exceptions of lumos.train.

``TrainError`` is the base of everything this package raises on purpose.
Every exception here pickles (they cross Ray processes and Tune trials).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TrainError(Exception):
    """Base class of the errors raised by lumos.train."""


class TrainConfigError(TrainError, ValueError):
    """A trainer argument is invalid (raised before any worker starts)."""


class CheckpointReportError(TrainError, ValueError):
    """A ``train.report()`` checkpoint cannot be committed as asked.

    The ranks disagreed about the checkpoint of one report (different
    ``checkpoint_dir_name`` values, or a rank returned without sending a report
    the others sent with a checkpoint), or ``checkpoint_dir_name`` was given
    without a checkpoint.
    """


class TrainTypeError(TrainError, TypeError):
    """A value of the wrong type was passed to a ``lumos.train`` function (e.g. metrics
    that are not a dict)."""


class NotInTrainingFunctionError(TrainError, RuntimeError):
    """``train.report()`` / ``get_context()`` / ``get_checkpoint()`` was called outside
    a training function run by a lumos trainer."""


class TrainingFailedError(TrainError):
    """The run failed and could not be recovered.

    Raised by ``fit()`` when a non-retryable error happened or when the
    ``FailureConfig(max_failures=...)`` budget is exhausted.

    Attributes:
        message: what happened, naming the setting and the way out.
        worker_errors: every failed worker's error, by world rank (the latest
            failure of each rank). Values are the remote errors from the
            workers (``lumos.runtime.RemoteError``: ``str()`` shows the remote
            traceback) or plain exceptions for driver-side failures.
        failures: how many restarts the run had used when it gave up.

    Example:
        >>> try:
        ...     trainer.fit()  # doctest: +SKIP
        ... except train.TrainingFailedError as e:
        ...     for rank, err in e.worker_errors.items():
        ...         print(rank, err)
    """

    def __init__(
        self,
        message: str,
        worker_errors: Mapping[int, BaseException] | None = None,
        failures: int = 0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.worker_errors: dict[int, BaseException] = dict(worker_errors or {})
        self.failures = failures

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.worker_errors, self.failures))

    def __str__(self) -> str:
        if not self.worker_errors:
            return self.message
        parts = [self.message]
        for rank in sorted(self.worker_errors):
            err = self.worker_errors[rank]
            text = str(err).rstrip() or type(err).__name__
            parts.append(f"--- rank {rank}: {text}")
        return "\n".join(parts)


class WorkerGroupError(TrainingFailedError):
    """The run failed because training workers failed (Ray's ``ray.train.WorkerGroupError``).

    What ``fit()`` raises when worker errors (a raised exception, a dead or hung
    actor, a failed upload) exhausted ``FailureConfig(max_failures)`` or could not be
    retried. A ``TrainingFailedError``: ``except train.TrainingFailedError`` still
    catches it.

    Attributes:
        worker_failures: Ray's name of :attr:`worker_errors`: each failed rank's error.

    Example:
        >>> try:
        ...     trainer.fit()  # doctest: +SKIP
        ... except train.WorkerGroupError as e:
        ...     print(sorted(e.worker_failures))
    """

    @property
    def worker_failures(self) -> dict[int, BaseException]:
        """Each failed world rank's error (the same dict as ``worker_errors``)."""
        return self.worker_errors


class ControllerError(TrainingFailedError):
    """The run failed in the driver, not in a worker (Ray's ``ray.train.ControllerError``):
    a callback or a health check raised, the run's storage failed, a checkpoint could
    not be committed as reported.

    Attributes:
        controller_failure: The driver-side exception.
    """

    @property
    def controller_failure(self) -> BaseException | None:
        """The driver-side exception (``worker_errors[-1]``), or None."""
        return self.worker_errors.get(-1)


def training_failed(
    message: str, worker_errors: Mapping[int, BaseException] | None = None, failures: int = 0
) -> TrainingFailedError:
    """The error ``fit()`` raises: a :class:`WorkerGroupError` when any worker rank
    failed, else a :class:`ControllerError` (only the driver's error, at rank ``-1``)."""
    errors = dict(worker_errors or {})
    kind = WorkerGroupError if any(rank >= 0 for rank in errors) else ControllerError
    return kind(message, errors, failures)


class RankStuckError(TrainError, RuntimeError):
    """A rank's training thread stopped making progress (the hang watchdog fired).

    Found in ``TrainingFailedError.worker_errors[rank]`` (as the ``cause`` of the
    rank's ``RemoteError``, whose ``traceback`` is the rank's stack).

    Attributes:
        rank: The culprit rank this error is about.
        node_id: Its node, when known.
        where: Its innermost user frame, ``file:line in function``.
        why: Why it is the culprit (e.g. not inside a collective while others wait).
        culprits: Every culprit rank of this hang.
        stacks_path: Where every rank's stacks were written (``_lumos/hangs/attempt-N``).
    """

    def __init__(
        self,
        message: str,
        rank: int,
        node_id: str | None,
        where: str,
        why: str,
        culprits: tuple[int, ...],
        stacks_path: str,
    ) -> None:
        super().__init__(message)
        self.rank, self.node_id, self.where, self.why = rank, node_id, where, why
        self.culprits, self.stacks_path = culprits, stacks_path

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.rank, self.node_id, self.where, self.why, self.culprits, self.stacks_path)
        return (type(self), (str(self), *args))


class DriverTerminated(KeyboardInterrupt):
    """SIGTERM reached the driver during ``fit()``: the run stops as on Ctrl-C, then
    ``fit()`` exits the process with status 143 (not public: it never escapes ``fit``)."""
