"""The hang watchdog: finds a rank whose training thread stopped, names it, fails the attempt.

A worker whose process froze stops answering the health check (``WorkerHungEvent``).
This component finds the hang of real jobs instead: the process answers, but its
training thread makes no progress (a deadlock, an endless loop, a ``sleep``, a data
loader waiting on a dead source) while the other ranks wait for it in a collective.

Every ``interval_s`` (in ``idle``) it polls its :class:`HangProbe` for each rank's
sample (``hang_sampler.py``: reports, stack moves, collective, expected waits) and
feeds the pure ``HangJudge`` (``controller/hang_judge.py``, which says what counts as
progress and who the culprit is). When a rank is stuck for
``FailureConfig(hang_timeout_s)``:

1. every rank's Python stacks (all threads) are written to
   ``_lumos/hangs/attempt-<N>/rank-<R>.txt`` (with ``hang.json``, the finding), through
   the storage's retried writes;
2. one line per culprit: ``rank R on node N stuck at file:line in function (why)``;
3. the verdict :class:`~lumos.train._internal.controller.seam.RanksStuck` holds one
   ``WorkerFailure`` (``HUNG``) per culprit, whose error's cause is a
   ``RankStuckError`` (culprit, node, frame, stacks path): the failure policy decides
   the restart, and ``TrainingFailedError.worker_errors`` carries it.

On Ray through :func:`ray_hang_watchdog`; in local mode and under torchrun through
``local_hang.py`` (its own thread and probes; the process exits when it fires).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lumos.runtime import FailureKind, RemoteError, WorkerFailure
from lumos.storage import retried_write
from lumos.train._internal.controller.hang_judge import Finding, HangJudge
from lumos.train._internal.controller.hang_probe import HangProbe, RayHangProbe
from lumos.train._internal.controller.seam import Attempt, Component, RanksStuck, Verdict
from lumos.train._internal.errors import RankStuckError

if TYPE_CHECKING:
    from lumos.storage import RunStorage
    from lumos.train._internal.console import Console
    from lumos.train._internal.controller.group import GroupDriver
    from lumos.train._internal.controller.spec import ControllerSpec

STACKS_TIMEOUT_S = 10.0
"""How long the watchdog waits for the ranks' stacks once it fired."""

AWAY_S = 1.0
"""A look this much later than due means the driver was busy elsewhere (starting a
worker for a moved or replaced rank takes seconds): that gap counts as no rank's stall,
since the samples answered meanwhile may have been taken before it."""


def probe_interval_s(timeout_s: float) -> float:
    """How often the ranks are sampled: every 0.5 s, or a tenth of a short timeout (a
    stall is found within about ``timeout_s`` + 2 intervals + the stacks' fetch)."""
    return max(0.05, min(0.5, timeout_s / 10))


def stuck_line(rank: int, node: str | None, where: str, why: str, path: str) -> str:
    """The console line of one culprit."""
    return f"rank {rank} on node {node or '?'} stuck at {where} ({why}); stacks: {path}"


class HangWatchdog(Component):
    """Samples the ranks and fails a stuck attempt (see the module docstring).

    Args:
        storage: The run's storage (the stacks go under its ``_lumos/``).
        console: Where the culprit line goes.
        probe: Asks the ranks for samples and stacks.
        timeout_s: ``FailureConfig(hang_timeout_s)``.
        node_of: The node id of a rank's worker.
        interval_s: How often to sample (default :func:`probe_interval_s`).
        avoid: Called with the culprits' nodes when it fires
            (``FailureConfig(hang_avoid_node)``: the restart avoids them).
        peers: Peer recovery is on (``TorchftConfig``): expected waits pause only the
            waiting rank (``HangJudge(per_rank=True)``), and after it fired the watchdog
            judges the same attempt again (the stuck ranks are replaced, the others go on).
        clock: The driver's clock (tests pass a fake one).
    """

    def __init__(
        self,
        storage: RunStorage,
        console: Console,
        probe: HangProbe,
        timeout_s: float,
        node_of: Callable[[int], str | None],
        *,
        interval_s: float | None = None,
        avoid: Callable[[set[str]], None] | None = None,
        peers: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._peers = peers
        self._avoid = avoid
        self._storage = storage
        self._console = console
        self._probe = probe
        self.timeout_s = timeout_s
        self._node_of = node_of
        self.interval_s = probe_interval_s(timeout_s) if interval_s is None else interval_s
        self._clock = clock
        self._judge: HangJudge | None = None
        self._running: set[int] = set()  # the attempt's ranks still in the function
        self._answered: set[int] = set()  # ranks sampled since the last judgement
        self._attempt = -1
        self._next = 0.0
        self.findings: list[Finding] = []

    def attempt_started(self, attempt: Attempt) -> None:
        self._probe.reset()
        self._attempt = attempt.index
        self._running = attempt.running  # RunCore keeps it current
        self._answered = set()
        self._judge = self._new_judge(attempt.world_size)
        self._next = 0.0

    def idle(self, timeout_s: float) -> Verdict | None:
        judge = self._judge
        now = self._clock()
        if judge is None or now < self._next:
            return None
        late = now - self._next if self._next else 0.0
        if late > max(AWAY_S, 2 * self.interval_s):  # samples in hand may predate the gap
            judge.pause(late)
        self._next = now + self.interval_s
        for rank, sample in self._probe.poll().items():
            if rank in self._running:
                judge.observe(rank, sample, now)
                self._answered.add(rank)
        for rank in set(judge.ranks) - self._running:  # it returned: nothing to wait for
            judge.forget(rank)
        if not self._running <= self._answered:  # judged once every rank answered: a late
            return None  # answer (a loaded machine) may be an expected wait of its own
        self._answered = set()
        judge.world_size = len(self._running)  # ranks join and leave under peer recovery
        finding = judge.stuck(now)
        if finding is None:
            return None
        self._judge = self._new_judge(len(self._running)) if self._peers else None
        self.findings.append(finding)  # once per attempt, unless stuck ranks are replaced
        return self._fire(finding)

    def rank_joined(self, rank: int) -> None:
        """A new process took ``rank`` (peer recovery): its old one's samples are stale;
        the rank is judged again once the new one answers."""
        if self._judge is not None:
            self._judge.forget(rank)
        self._answered.discard(rank)

    def _new_judge(self, world_size: int) -> HangJudge | None:
        return HangJudge(world_size, self.timeout_s, self._peers) if world_size else None

    def worker_failed(self, failures: Sequence[WorkerFailure], will_retry: bool) -> None:
        self._judge = None
        self._probe.reset()

    def run_ending(self, finished: bool) -> None:
        self._judge = None
        self._probe.reset()

    def _fire(self, finding: Finding) -> RanksStuck:
        fired_at = time.time()
        stacks = self._probe.stacks(STACKS_TIMEOUT_S)
        relative = f"hangs/attempt-{self._attempt}"
        folder = f"{self._storage.state_dir}/{relative}"
        path = f"{self._storage.uri}/_lumos/{relative}"
        for rank, text in sorted(stacks.items()):
            retried_write(self._storage.fs, f"{folder}/rank-{rank}.txt", text.encode())
        summary = {
            "attempt": self._attempt,
            "culprits": list(finding.culprits),
            "stuck": list(finding.stuck),
            "why": {str(r): w for r, w in finding.why.items()},
            "where": {str(r): w for r, w in finding.where.items()},
            "nodes": {str(r): self._node_of(r) for r in finding.where},
            "stalled_s": round(finding.stalled_s, 3),
            "timeout_s": self.timeout_s,
            "fired_at_unix": fired_at,  # when the watchdog fired (before the stacks)
        }
        retried_write(self._storage.fs, f"{folder}/hang.json", json.dumps(summary).encode())
        failures = []
        for rank in finding.culprits:
            node, where = self._node_of(rank), finding.where.get(rank, "?")
            line = stuck_line(rank, node, where, finding.why.get(rank, ""), path)
            self._console.info(line)
            error = RankStuckError(
                line, rank, node, where, finding.why.get(rank, ""), finding.culprits, path
            )
            remote = RemoteError(
                "lumos.train.RankStuckError",
                line,
                stacks.get(rank, ""),
                cause=error,
                rank=rank,
            )
            short = f"stuck at {where} ({finding.why.get(rank, '')}); stacks: {path}"
            failures.append(WorkerFailure(rank, FailureKind.HUNG, node, remote, short))
        nodes = {f.node_id for f in failures if f.node_id}
        if self._avoid is not None and nodes:
            self._avoid(nodes)
        return RanksStuck(tuple(failures))


def ray_hang_watchdog(spec: ControllerSpec, workers: GroupDriver) -> tuple[Component, ...]:
    """The Ray controller's watchdog over its group (none when ``hang_timeout_s`` is None)."""
    if spec.hang_timeout_s is None:
        return ()
    probe = RayHangProbe(lambda: workers.group)
    run = spec.run
    avoid = workers.avoid_next if spec.hang_avoid_node else None
    peers = spec.backend.peer_recovery
    dog = HangWatchdog(
        run.storage, run.console, probe, spec.hang_timeout_s, workers.node_of, avoid=avoid,
        peers=peers,
    )  # fmt: skip
    return (dog,)
