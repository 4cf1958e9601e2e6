"""Peer recovery (``TorchftConfig``): a dead rank is replaced while the others train on.

Without it, any failure ends the attempt: every rank stops and resumes from the latest
committed checkpoint. With a backend that sets ``peer_recovery`` (torchft), the
controller first asks :meth:`PeerRecovery.recover`: when the failed ranks can be
replaced and at least one rank still trains (a live peer holds the state), their
workers are replaced (the warm standby first), the training function is launched on
them alone with the attempt's own arguments (but the latest committed checkpoint as
``get_checkpoint()``), and the report aggregator stops waiting
for them until they report (``RunCore.rank_replaced``). The survivors' functions never
stop; the replacement receives the state from a live peer at its first step
(``torch/torchft_loop.py``). Each recovery counts as one failure against
``FailureConfig(max_failures)``; past it, or when no rank is left alive, the failure
takes the ordinary path (stop, restart from the latest checkpoint, or raise).

``PeerResize`` (``peer_resize.py``) changes the group while ranks train: in an elastic
group (``num_workers=(min, max)``) it decides instead of a plain replacement (a lost
rank stays vacant while no room is found; the others train on at the smaller size),
and in any group ranks under a preemption notice move at once. :meth:`PeerRecovery.step`
launches the ranks that join that way (room came back, a rank moved) as it launches a
replacement. A lost rank under a preemption notice counts against
``FailureConfig(max_preemption_failures)``, not ``max_failures``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from lumos.runtime import FailureKind, FailurePolicy, WorkerFailure
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.components.peer_resize import PeerResize
from lumos.train._internal.controller.group import GroupDriver
from lumos.train._internal.controller.run_book import RunBook
from lumos.train._internal.controller.seam import Attempt, Component, Verdict
from lumos.train._internal.session import WorkerHooks
from lumos.train._internal.train_context import WorkerRunArgs

REPLACEABLE = frozenset({FailureKind.ACTOR_DIED, FailureKind.HUNG, FailureKind.USER_ERROR})
"""Failures a rank recovers from by replacement: its process died, hung or its function
raised (its worker is replaced too, so no state of the failed function survives)."""


def ranks_to_replace(
    failures: Sequence[WorkerFailure], running: set[int], world_size: int
) -> list[int] | None:
    """The ranks peer recovery replaces, or ``None`` when it cannot (pure).

    Args:
        failures: The batch's failures.
        running: The attempt's ranks whose function has not ended (failed ones removed).
        world_size: The attempt's number of ranks.

    Returns:
        The failed ranks, sorted, when every failure is a rank's and replaceable and a
        live rank outside them remains; else ``None``.
    """
    if not failures or any(f.rank < 0 or f.kind not in REPLACEABLE for f in failures):
        return None
    failed = sorted({f.rank for f in failures})
    if any(r >= world_size for r in failed) or not (running - set(failed)):
        return None
    return failed


class ReplacedSink(Protocol):
    """What learns of a replaced rank (``RunCore.rank_replaced``) and holds the run's
    committed checkpoints (``RunCore.book``)."""

    book: RunBook

    def rank_replaced(self, rank: int, joins: bool = True) -> Verdict | None: ...


def replacement_args(args: WorkerRunArgs, book: RunBook) -> WorkerRunArgs:
    """``args`` for a rank launched alone into the running attempt: its
    ``get_checkpoint()`` is the run's latest committed checkpoint now. The one the
    attempt started from may be gone by then (retention keeps the newest)."""
    latest = book.latest()
    return replace(
        args,
        checkpoint_dir_name=latest.dir_name if latest else None,
        committed_names=tuple(book.state.checkpoint_names()),
        starting_checkpoint=None if latest else args.starting_checkpoint,
    )


@dataclass(frozen=True)
class Recovered:
    """A peer recovery that happened: the replaced ranks, a verdict of the commits that
    stopped waiting for them (``None``: go on), and whether the preemption budget paid
    for it (not ``max_failures``)."""

    ranks: tuple[int, ...]
    verdict: Verdict | None = None
    preemption: bool = False


class PeerRecovery(Component):
    """Replaces failed ranks in a running attempt (see the module docstring).

    Args:
        workers: The run's group driver.
        console: Where state lines go.
        policy: The run's failure policy (``FailureConfig(max_failures)``).
        enabled: The backend recovers ranks from their peers (``Backend.peer_recovery``).
        resize: An elastic group's changes while ranks train (``None``: fixed size).
    """

    def __init__(
        self,
        workers: GroupDriver,
        console: Console,
        policy: FailurePolicy,
        enabled: bool,
        resize: PeerResize | None = None,
    ) -> None:
        self._workers = workers
        self._console = console
        self._policy = policy
        self.enabled = enabled
        self._resize = resize if enabled else None
        self._launch: tuple[Any, ...] | None = None
        self._attempt: Attempt | None = None
        self.recoveries = 0

    def attempt_started(self, attempt: Attempt) -> None:
        self._attempt = attempt
        if self.enabled:
            attempt.reports.follow_peer_recovery()

    def launched(self, fn: Any, args: tuple[Any, ...], hooks: WorkerHooks | None) -> None:
        """The attempt's launch: what a replacement runs (the same function and args,
        with ``hooks.for_replacement()``). Kept only when peer recovery is on: the hooks
        hold the attempt's dataset shards (Ray Data's coordinators live while they do)."""
        if self.enabled:
            self._launch = (fn, (*args, hooks.for_replacement() if hooks is not None else None))

    def run_ending(self, finished: bool) -> None:
        self._launch = self._attempt = None  # the trainer keeps its last controller

    def recover(
        self, failures: Sequence[WorkerFailure], failures_so_far: int, core: ReplacedSink
    ) -> Recovered | None:
        """Replace the failed ranks while the others go on; ``None``: take the ordinary path.

        Args:
            failures: The batch's failures.
            failures_so_far: Failures the run recovered from so far.
            core: The ``RunCore`` (``book``, ``rank_replaced``).
        """
        attempt = self._attempt
        if not self.enabled or self._launch is None or attempt is None:
            return None
        ranks = ranks_to_replace(failures, attempt.running, attempt.world_size)
        if ranks is None:
            return None
        resize = self._resize
        decision = resize.lost_decision(failures) if resize is not None else None
        preemption = decision is not None
        if decision is None:
            decision = self._policy.make_decision(list(failures), failures_so_far)
        if not decision.should_retry:
            return None
        t0 = time.monotonic()
        try:
            if resize is None or not resize.elastic:
                self._workers.replace_ranks(ranks)
                joined: list[int] | None = ranks
            else:
                joined = resize.after_loss(ranks)
            if joined is None:  # below min_workers: the ordinary path
                return None
            verdict = self._start(joined, core)
        except Exception as exc:
            self._console.info(messages.replace_failed_line(exc))
            return None
        self.recoveries += 1
        if preemption and resize is not None:
            resize.recovered_preemption()
        for f in failures:
            self._console.info(messages.describe_failure(f, self._workers.workers))
        if joined:
            seconds = time.monotonic() - t0
            self._console.info(messages.peer_recovery_line(joined, seconds, decision))
        for rank in set(ranks) - set(joined):  # vacant: reports stop waiting for it
            verdict = core.rank_replaced(rank, joins=False) or verdict
        return Recovered(tuple(ranks), verdict, preemption)

    def step(self, core: ReplacedSink) -> Verdict | None:
        """While training runs: launch the ranks ``PeerResize`` gives a new worker now
        (a rank moved off a preempted node; room came back in an elastic group)."""
        attempt = self._attempt
        if self._resize is None or self._launch is None or attempt is None:
            return None
        try:
            joined = self._resize.step(attempt.running)
            if not joined:
                return None
            self._console.info(messages.peers_joined_line(joined))
            return self._start(joined, core)
        except Exception as exc:  # a new worker failed to start: the ranks go on; retried
            self._console.info(messages.join_failed_line(exc))
            return None

    def _start(self, ranks: list[int], core: ReplacedSink) -> Verdict | None:
        """Launch the training function alone on ``ranks``; reports stop waiting for
        them until they report (they count on from a live peer's report index)."""
        if not ranks:
            return None
        assert self._launch is not None
        fn, args = self._launch
        fresh = tuple(
            replacement_args(a, core.book) if isinstance(a, WorkerRunArgs) else a for a in args
        )
        self._workers.current().launch(fn, args=fresh, ranks=ranks)
        verdict = None
        for rank in ranks:
            verdict = core.rank_replaced(rank) or verdict
        return verdict
