"""Trials as everyone outside the driver loop sees them: status, names, frozen records.

A :class:`Trial` is a frozen snapshot (``LiveTrial.snapshot`` in ``live_trial.py``,
the driver's own record) taken when a hook runs, so a callback can neither change the
sweep's state nor see it change later. :class:`ExploitRecord` is one population-based
training clone, as the trial journal stores it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class ExploitRecord:
    """Trial ``number`` cloned trial ``donor`` (population-based training).

    Attributes:
        number: The exploited trial.
        donor: The trial it cloned.
        step: The exploited trial's ``training_iteration`` at the clone; its reports
            go on from here.
        checkpoint_dir: The cloned checkpoint, committed in the exploited trial's directory.
        old_config: Its config before.
        new_config: Its config after (the donor's, perturbed).
        operations: What was done to each mutated parameter.
        donor_checkpoint: The donor's checkpoint that was copied.
    """

    number: int
    donor: int
    step: int
    checkpoint_dir: str
    old_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, Any] = field(default_factory=dict)
    donor_checkpoint: str = ""


@dataclass(frozen=True, eq=False)
class Trial:
    """One trial as callbacks and results see it: a frozen snapshot.

    Attributes:
        number: The Optuna trial number.
        trial_id: Short id (``"00007"``).
        trial_name: Directory name (``"trial_00007"``).
        config: The sampled config.
        params: The Optuna params (flat names).
        path: URL / local path of the trial's directory.
        status: A :class:`TrialStatus`.
        last_result: The last reported metrics.
        history: Every report, in order (read-only).
        checkpoint_dir: The latest committed checkpoint's directory name.
        iteration: Reports counted so far (``training_iteration``).
        attempt: 0 for the first run, then one more per retry.
        errors: Every error the trial raised (retried ones too), as ``TrialError``.
        stop_reason: Why the driver asked the trial to stop (``"pruned"``, ``"stop"``,
            ``"time_budget"``, ``"abort"``), if it did.
        waiting_for_resources: Its actor is created but not yet placed by Ray.
        start_time: When the trial first started (``time.time()``), 0 if never.
        end_time: When it ended, 0 while it has not.
        exploits: Every time population-based training made it clone another trial.
        dir_name: The trial's directory in the experiment (``trial_dirname_creator``'s).
        trainable_name: The trial function's name (Ray's ``Trial.trainable_name``).
    """

    number: int
    trial_id: str
    trial_name: str
    config: dict[str, Any]
    params: dict[str, Any]
    path: str
    status: TrialStatus
    last_result: dict[str, Any]
    history: Sequence[dict[str, Any]]
    checkpoint_dir: str | None
    iteration: int
    attempt: int
    errors: tuple[TrialError, ...]
    stop_reason: str | None
    waiting_for_resources: bool
    start_time: float
    end_time: float
    exploits: tuple[ExploitRecord, ...] = ()
    dir_name: str = ""
    trainable_name: str = ""

    @property
    def error(self) -> TrialError | None:
        """The error that ended the trial (status ERROR), else None."""
        if self.status is TrialStatus.ERROR and self.errors:
            return self.errors[-1]
        return None

    def __repr__(self) -> str:
        return f"Trial({self.trial_name}, {self.status.value}, config={self.config!r})"
