"""Controller states: explicit classes carrying their payload."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lumos.runtime import MoveDecision, WorkerFailure
    from lumos.storage import CheckpointRecord
    from lumos.train._internal.controller.health_monitor import Fired
    from lumos.train._internal.errors import TrainingFailedError
    from lumos.train._internal.result import Result


@dataclass(frozen=True)
class ControllerState:
    """Base of every state; ``terminal`` states end ``TrainController.run``."""

    terminal = False

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("State").lower()


@dataclass(frozen=True)
class InitializingState(ControllerState):
    """Nothing started yet."""


@dataclass(frozen=True)
class SchedulingState(ControllerState):
    """The training function is about to be launched for ``attempt``.

    Attributes:
        attempt: the attempt about to start.
        resume_from: the checkpoint every rank resumes from.
        keep_group: relaunch on the running group, whose failed ranks were already
            replaced; ``False`` starts a new worker group.
        cleanup: remove the ended attempt's uploads that never committed first.
        after: ``"rollback"`` or ``"resize"`` when the attempt follows one (the console
            says how long it took, from ``since``: ``time.monotonic()``).
        since: when that rollback or resize began.
    """

    attempt: int
    resume_from: CheckpointRecord | None
    keep_group: bool = False
    cleanup: bool = False
    after: str | None = None
    since: float = 0.0


@dataclass(frozen=True)
class RunningState(ControllerState):
    """The training function runs on every worker (``said_waiting``: the console said
    that the run waits for its last validations)."""

    attempt: int
    said_waiting: bool = False


@dataclass(frozen=True)
class RestartingState(ControllerState):
    """Workers failed; the failure policy decides whether to restart.

    Attributes:
        failures: what failed (one entry per failed rank).
        attempt: the attempt that failed.
        ended_ranks: ranks whose training thread already ended (they need no stop).
        stragglers: a rank did not end within ``stop_grace_s`` (start a new group).
    """

    failures: tuple[WorkerFailure, ...]
    attempt: int
    ended_ranks: frozenset[int] = field(default_factory=frozenset)
    stragglers: bool = False


@dataclass(frozen=True)
class RollingBackState(ControllerState):
    """A health check fired: training goes back to an earlier checkpoint.

    Attributes:
        fired: Which check fired, on what, and what it asked for.
        attempt: The attempt being rolled back.
        ended_ranks: ranks whose training thread already ended (they need no stop).
        dead_ranks: ranks whose process died meanwhile (replaced before the restart).
    """

    fired: Fired
    attempt: int
    ended_ranks: frozenset[int] = field(default_factory=frozenset)
    dead_ranks: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class ResizingState(ControllerState):
    """The group changes at a checkpoint boundary: it grows, or preempted ranks move.

    Attributes:
        move: Why, and which ranks are under a preemption notice.
        attempt: The attempt that ends here.
        ended_ranks: ranks whose training thread already ended (they need no stop).
    """

    move: MoveDecision
    attempt: int
    ended_ranks: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class FinishedState(ControllerState):
    """Every rank returned; ``result`` is what ``fit()`` returns."""

    result: Result
    terminal = True


@dataclass(frozen=True)
class ErroredState(ControllerState):
    """The run failed for good; ``fit()`` raises ``error``."""

    error: TrainingFailedError
    terminal = True


@dataclass(frozen=True)
class AbortedState(ControllerState):
    """The run was stopped from outside (Ctrl-C, the parent job); ``fit()`` raises ``error``."""

    error: BaseException
    terminal = True
