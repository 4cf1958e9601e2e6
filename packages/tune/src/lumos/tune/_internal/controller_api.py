"""What the controller talks to: the executor and progress protocols, and its settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lumos.storage import RetentionPolicy
from lumos.tune._internal.executor import TrialEvent
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.trial_spec import TrialSpec

# Stop reasons (LiveTrial.stop_reason)
PRUNE = "pruned"
STOP = "stop"
TIME_BUDGET = "time_budget"
ABORT = "abort"
EXPLOIT = "exploit"


class Executor(Protocol):
    """What the controller needs from an executor (see ``PoolExecutor``)."""

    @property
    def num_running(self) -> int:
        """Trials started and not yet ended."""
        ...

    def start(self, spec: TrialSpec) -> None:
        """Run one attempt of a trial."""
        ...

    def stop(self, trial_id: str) -> list[TrialEvent]:
        """Ask a trial to stop; returns events that happen at once (``Cancelled``)."""
        ...

    def answer(self, trial_id: str, go: bool) -> None:
        """Answer a report that waits for the driver (go on, or stop at once)."""
        ...

    def keep_worker(self, trial_id: str) -> None:
        """Relaunch the trial on its own worker after the stop it is being sent."""
        ...

    def kill(self, trial_id: str) -> None:
        """End a trial at once."""
        ...

    def waiting_for_resources(self) -> list[str]:
        """Ids of trials whose worker cannot be placed for lack of resources."""
        ...

    def release_idle(self, keep: int) -> None:
        """Release workers with nothing to run beyond ``keep``."""
        ...

    def poll(self, timeout_s: float | None) -> list[TrialEvent]:
        """Trial events, waiting up to ``timeout_s`` for the first."""
        ...


class ProgressSink(Protocol):
    """Where the controller reports progress (console reporter or nothing)."""

    def update(self, trials: list[LiveTrial], *, force: bool = False) -> None:
        """The trials, every loop iteration (the sink decides when to redraw)."""
        ...

    def trial_done(self, trial: LiveTrial) -> None:
        """A trial ended."""
        ...

    def waiting_for_resources(self, trials: list[LiveTrial], resources: dict[str, float]) -> None:
        """``trials`` started waiting for ``resources``."""
        ...


class NullProgress:
    """Prints nothing."""

    def update(self, trials: list[LiveTrial], *, force: bool = False) -> None:
        """Nothing."""
        return None

    def trial_done(self, trial: LiveTrial) -> None:
        """Nothing."""
        return None

    def waiting_for_resources(self, trials: list[LiveTrial], resources: dict[str, float]) -> None:
        """Nothing."""
        return None


@dataclass
class ControllerSettings:
    """Run settings the controller needs besides TuneConfig."""

    max_concurrent_trials: int
    max_failures: int = 0
    stop_grace_s: float = 30.0
    progress_interval_s: float = 2.0
    resources_check_interval_s: float = 2.0
    journal_interval_s: float = 1.0
    retention: RetentionPolicy | None = None
