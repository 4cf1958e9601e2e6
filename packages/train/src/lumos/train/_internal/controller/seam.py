"""The driver's seam: the hooks one capability of a Train run plugs into.

The run core (``core.py``) owns the bookkeeping every backend shares and calls the
hooks of its components at fixed points, in registration order. A component is one
capability in one module under ``components/``: validation, health checks and
rollback, loader positions, and (Ray backend only) elastic resizing and preemption.

Hooks, in the order a run meets them:

* :meth:`Component.attempt_started`: a launch of the training function begins.
* :meth:`Component.report_received`: rank 0's report, before it can commit or reach a
  callback; a component may stop the attempt (a :data:`Verdict`).
* :meth:`Component.before_commit`: a checkpoint is about to be named by the run state;
  write files into it, or add to its record (the :class:`CommitDraft`).
* :meth:`Component.report_committed`: the run state names the checkpoint.
* :meth:`Component.validation_finished`: a checkpoint's validation ended and is stored.
* :meth:`Component.idle`: the driver has nothing else to do for up to ``timeout_s``.
* :meth:`Component.rank_joined`: peer recovery gave a rank a new process while the
  attempt runs (what a component knew of its old process is stale).
* :meth:`Component.outstanding`: how much work the run still waits for after every
  rank returned (the run finishes at 0).
* :meth:`Component.rolled_back`: checkpoints were rolled back (their work is moot).
* :meth:`Component.worker_failed`: the attempt failed; whether the run retries.
* :meth:`Component.run_ending`: the run ends (finished, failed or stopped).

How to add a component (e.g. a stuck-rank watchdog, peer recovery, FSDP checkpoints):

1. Subclass :class:`Component` in a new module under ``controller/components/`` and
   override only the hooks it needs; every hook is a no-op by default.
2. Take what it needs in its constructor: a :class:`RunHandle` (the run book, the
   console, the notice channel to the ranks) and its settings.
3. Register it: every backend's components are built in ``RunCore.__init__``; a
   backend-only one is passed as ``RunCore(..., extra=(component,))``.
4. Unit-test it through ``RunCore`` with a fake ``notify`` (``test_run_core.py``), then
   on ``FakeCluster`` through ``fit()``.

Rules: hooks run in the driver's thread and return quickly (only ``idle`` may wait,
for at most ``timeout_s``). A component that needs the attempt stopped returns a
:data:`Verdict`; it never raises to steer the run. It writes the run state only
through the run book, and only for its own capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lumos.runtime import WorkerFailure
    from lumos.storage import Checkpoint, CheckpointRecord
    from lumos.train._internal.console import Console
    from lumos.train._internal.controller.health_monitor import Fired
    from lumos.train._internal.controller.reports import Commit, ReportAggregator
    from lumos.train._internal.controller.run_book import RunBook
    from lumos.train._internal.controller.validations import Outcome
    from lumos.train._internal.wire import RankReport


@dataclass
class Attempt:
    """One launch of the training function: every per-attempt fact, in one object.

    Attributes:
        index: The attempt's number in the run (also across ``fit()`` calls).
        world_size: Its number of ranks.
        base: The index of its first report (the resumed checkpoint's index + 1).
        resume: The checkpoint every rank resumed from, or ``None``.
        reports: The attempt's report aggregator.
        running: Ranks whose training function has not ended yet.
        commits: Checkpoints committed in this attempt so far.
    """

    index: int
    world_size: int
    base: int
    resume: CheckpointRecord | None
    reports: ReportAggregator
    running: set[int] = field(default_factory=set)
    commits: int = 0


@dataclass
class CommitDraft:
    """A checkpoint about to be committed; ``before_commit`` hooks may add to its record.

    Attributes:
        commit: The aggregator's commit.
        attempt: The attempt it belongs to.
        validation_request: What its validation runs with; set by the validation
            component (the checkpoint is then committed with its validation pending).
    """

    commit: Commit
    attempt: Attempt
    validation_request: dict[str, Any] | None = None


@dataclass(frozen=True)
class Committed:
    """A checkpoint the run state now names.

    Attributes:
        commit: The aggregator's commit.
        checkpoint: The committed checkpoint.
        validation_request: Its pending validation's request, or ``None``.
    """

    commit: Commit
    checkpoint: Checkpoint
    validation_request: dict[str, Any] | None = None


@dataclass(frozen=True)
class Validated:
    """A validation that ended and is stored.

    Attributes:
        outcome: How it ended.
        record: The checkpoint's updated record (``None``: the checkpoint is gone).
    """

    outcome: Outcome
    record: CheckpointRecord | None


@dataclass(frozen=True)
class RollbackRequest:
    """Verdict: a health check fired; the attempt ends and training goes back."""

    fired: Fired


@dataclass(frozen=True)
class RunBroken:
    """Verdict: the run cannot go on (a misuse no retry fixes, a broken check)."""

    error: Exception


@dataclass(frozen=True)
class RanksStuck:
    """Verdict: ranks stopped making progress (the hang watchdog); a failure like any
    other, which the failure policy decides on."""

    failures: tuple[WorkerFailure, ...]


Verdict = RollbackRequest | RunBroken | RanksStuck
"""What a hook returns when the attempt must stop (``None``: go on)."""


class RunHandle(Protocol):
    """What the run core lends its components."""

    @property
    def book(self) -> RunBook:
        """The run book (the stored run state)."""
        ...

    @property
    def console(self) -> Console:
        """Where state lines go."""
        ...

    def notify(self, message: tuple[Any, ...]) -> None:
        """Send a driver notice to every rank (``wire.py``)."""

    def validation_finished(self, outcome: Outcome) -> Verdict | None:
        """Store a validation's outcome, tell the ranks and the components."""


class Component:
    """One capability of the driver (see the module docstring); every hook is a no-op."""

    def attempt_started(self, attempt: Attempt) -> None:
        """A launch of the training function begins (its ranks are about to start)."""

    def report_received(self, report: RankReport) -> Verdict | None:
        """Rank 0's report arrived; it has not committed or reached a callback yet."""
        return None

    def before_commit(self, draft: CommitDraft) -> None:
        """A checkpoint is about to be committed (files written now commit with it)."""

    def report_committed(self, committed: Committed) -> None:
        """The run state names a new checkpoint (the ranks are told right after)."""

    def validation_finished(self, validated: Validated) -> Verdict | None:
        """A validation ended; its metrics are merged into the checkpoint's record."""
        return None

    def idle(self, timeout_s: float) -> Verdict | None:
        """Nothing else to do for up to ``timeout_s`` seconds (poll your work here)."""
        return None

    def rank_joined(self, rank: int) -> None:
        """Peer recovery launched ``rank`` in a new process into the running attempt."""

    def outstanding(self) -> int:
        """Work the run still waits for once every rank returned (0: none)."""
        return 0

    def rolled_back(self, dir_names: set[str]) -> None:
        """These checkpoints were rolled back (before they were renamed)."""

    def worker_failed(self, failures: Sequence[WorkerFailure], will_retry: bool) -> None:
        """The attempt failed; ``will_retry``: the run starts another attempt."""

    def run_ending(self, finished: bool) -> None:
        """The run ends (``finished``: every rank returned and nothing is outstanding)."""
