"""Exceptions of lumos.tune: one base class and a few meaningful subclasses.

Every exception here pickles with its fields (``__reduce__``) because trial
errors and ``TrialPruned`` cross Ray processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna


class TuneError(Exception):
    """Base class of every error raised by ``lumos.tune``."""


class TuneConfigError(TuneError, ValueError):
    """A setting or argument of ``lumos.tune`` has an invalid value (also a ``ValueError``)."""


class TuneTypeError(TuneError, TypeError):
    """An argument of ``lumos.tune`` has the wrong type (also a ``TypeError``).

    Example:
        >>> tune.Tuner(42)  # raises TuneTypeError: trainable must be a function ...
    """


class SearchSpaceError(TuneConfigError):
    """A search space entry is invalid (for example ``uniform(low=1, high=0)``)."""


class TrialPruned(TuneError, optuna.TrialPruned):
    """Raised by ``tune.report`` in a trial the driver has ended early.

    The pruner (or the stop criteria) decided on an earlier report; the trial's
    next ``tune.report`` raises this so that the trial function unwinds. Let it
    propagate (or return): the trial then ends cleanly as PRUNED (or TERMINATED
    when a stop criterion ended it) and its actor runs the next trial.

    It subclasses ``optuna.TrialPruned``, so ``except optuna.TrialPruned`` works too.
    """

    def __init__(self, message: str = "trial was pruned") -> None:
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self),))


class MetricNotReportedError(TuneError):
    """A trial finished without ever reporting ``TuneConfig(metric=...)``.

    Attributes:
        metric: The metric the search optimizes.
        trial_name: The trial that did not report it.
        reported_keys: The metric names that trial did report.
    """

    def __init__(self, metric: str, trial_name: str, reported_keys: list[str]) -> None:
        self.metric = metric
        self.trial_name = trial_name
        self.reported_keys = list(reported_keys)
        keys = ", ".join(repr(k) for k in self.reported_keys) or "no metrics at all"
        super().__init__(
            f"Trial {trial_name!r} finished without reporting the metric {metric!r} that "
            f"TuneConfig(metric={metric!r}) optimizes; it reported {keys}. Report it with "
            f"tune.report({{{metric!r}: value}}) or set TuneConfig(metric=...) to one of "
            "the reported names."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.metric, self.trial_name, self.reported_keys))


@dataclass(frozen=True)
class TrialErrorRecord:
    """What is kept of one error of a trial: the journal stores it, results expose it.

    It is data, not an exception: :class:`TrialError` is the exception built from it
    (``TrialError.from_record``), for ``Result.error`` and ``TuneFailedError.errors``.

    Attributes:
        trial_name: The trial.
        attempt: 0 for the first run, 1 for the first retry, ...
        exc_type: Name of the original exception type (``"ValueError"``).
        error_message: ``str()`` of the original exception.
        traceback: The formatted traceback from the process that raised it.
    """

    trial_name: str
    attempt: int
    exc_type: str
    error_message: str
    traceback: str = ""


class TrialError(TuneError):
    """The error a trial ended with, as an exception (with the remote traceback).

    Built from the :class:`TrialErrorRecord` the driver keeps for the trial.

    Attributes:
        trial_name: The trial.
        attempt: 0 for the first run, 1 for the first retry, ...
        exc_type: Name of the original exception type (``"ValueError"``).
        error_message: ``str()`` of the original exception.
        traceback: The formatted traceback from the process that raised it.
    """

    def __init__(
        self,
        trial_name: str,
        attempt: int,
        exc_type: str,
        error_message: str,
        traceback: str = "",
    ) -> None:
        self.trial_name = trial_name
        self.attempt = attempt
        self.exc_type = exc_type
        self.error_message = error_message
        self.traceback = traceback
        super().__init__(
            f"Trial {trial_name!r} (attempt {attempt}) failed: {exc_type}: {error_message}"
        )

    @classmethod
    def from_record(cls, record: TrialErrorRecord) -> TrialError:
        """The exception for a stored error record."""
        return cls(
            record.trial_name,
            record.attempt,
            record.exc_type,
            record.error_message,
            record.traceback,
        )

    @property
    def record(self) -> TrialErrorRecord:
        """The stored record of this error."""
        return TrialErrorRecord(
            self.trial_name, self.attempt, self.exc_type, self.error_message, self.traceback
        )

    def __str__(self) -> str:
        head = str(self.args[0]) if self.args else ""
        if self.traceback:
            return f"{head}\n{self.traceback.rstrip()}"
        return head

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.trial_name, self.attempt, self.exc_type, self.error_message, self.traceback),
        )


class TuneFailedError(TuneError):
    """The sweep stopped because a trial failed and ``fail_fast="raise"``.

    Attributes:
        errors: Every trial error seen so far.
    """

    def __init__(self, message: str, errors: list[TrialError]) -> None:
        self.errors = list(errors)
        super().__init__(message)

    def __str__(self) -> str:
        base = str(self.args[0]) if self.args else ""
        return "\n\n".join([base, *(str(e) for e in self.errors)])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0] if self.args else "", self.errors))
