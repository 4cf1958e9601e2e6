"""The driver's record of one trial."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import optuna

from lumos.tune._internal.errors import TrialError


class TrialStatus(str, enum.Enum):
    """Where a trial is in its life."""

    PENDING = "PENDING"
    """Waiting to start (new, retried or resumed)."""
    RUNNING = "RUNNING"
    """Its function runs on an actor (or its actor waits for resources)."""
    TERMINATED = "TERMINATED"
    """Finished normally (or ended by a stop criterion / the time budget)."""
    PRUNED = "PRUNED"
    """Ended early by the pruner."""
    ERROR = "ERROR"
    """Failed after all retries."""

    @property
    def is_finished(self) -> bool:
        """Whether the trial is over."""
        return self in (TrialStatus.TERMINATED, TrialStatus.PRUNED, TrialStatus.ERROR)


def trial_name(number: int) -> str:
    """The deterministic directory name of trial ``number``."""
    return f"trial_{number:05d}"


def trial_id(number: int) -> str:
    """The short id of trial ``number``."""
    return f"{number:05d}"


@dataclass(eq=False)
class Trial:
    """One trial as the driver (and callbacks) see it.

    Attributes:
        number: The Optuna trial number.
        trial_id: Short id (``"00007"``).
        trial_name: Directory name (``"trial_00007"``).
        config: The sampled config.
        params: The Optuna params (flat names).
        status: A :class:`TrialStatus`.
        path: URL / local path of the trial's directory.
        last_result: The last reported metrics.
        history: Every report, in order.
        checkpoint_dir: The latest committed checkpoint's directory name.
        iteration: Reports counted so far (``training_iteration``).
        attempt: 0 for the first run, then one more per retry.
        errors: Every error the trial raised (retried ones too).
        stop_reason: Why the driver asked the trial to stop (``"pruned"``, ``"stop"``,
            ``"time_budget"``, ``"abort"``), if it did.
        waiting_for_resources: Its actor is created but not yet placed by Ray.
    """

    number: int
    config: dict[str, Any]
    params: dict[str, Any]
    path: str
    trial_id: str = ""
    trial_name: str = ""
    status: TrialStatus = TrialStatus.PENDING
    last_result: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_dir: str | None = None
    checkpoint_iteration: int = 0
    iteration: int = 0
    attempt: int = 0
    errors: list[TrialError] = field(default_factory=list)
    stop_reason: str | None = None
    waiting_for_resources: bool = False
    optuna_trial: optuna.Trial | None = field(default=None, repr=False)
    max_step_reported: int = -1
    seen_metrics: set[str] = field(default_factory=set, repr=False)
    start_time: float = 0.0
    end_time: float = 0.0

    def __post_init__(self) -> None:
        if not self.trial_id:
            self.trial_id = trial_id(self.number)
        if not self.trial_name:
            self.trial_name = trial_name(self.number)

    @property
    def error(self) -> TrialError | None:
        """The error that ended the trial (status ERROR), else None."""
        if self.status is TrialStatus.ERROR and self.errors:
            return self.errors[-1]
        return None

    def __repr__(self) -> str:
        return f"Trial({self.trial_name}, {self.status.value}, config={self.config!r})"
