"""HangJudge: which ranks of an attempt are stuck, and who the culprit is (pure: no I/O).

The watchdog (``components/hang_watchdog.py``) feeds it each rank's samples
(``hang_sampler.Sample``) with the driver's clock. A rank makes progress when its
report count grows or its training thread's stack moved since the previous sample.

* **Armed** only once every rank of the attempt is inside the user's function (a
  group waiting for resources, ranks starting, imports and the process-group set-up
  never count), and a rank's time counts from then on.
* **Expected waits reset everyone's clock**: while any rank is somewhere a long wait
  is expected (``train.report`` saving or uploading a checkpoint, waiting for a
  validation; ``torch.save``; an import) the others may wait for it in a collective.
* **Per rank under peer recovery** (``per_rank``: ``TorchftConfig``): an expected wait
  or a collective pauses only that rank's own clock, and counts as waiting for the others
  (a torchft quorum or collective, the launch barrier, a report waiting for its commit:
  bounded, and a rank that holds them up is outside any wait). A stuck rank is found
  while the others train on or wait.
* **Stuck**: a rank without progress for ``timeout_s`` (counted from the latest of
  its own progress, the arming and the last expected wait of any rank). Time in which
  the watchdog could not look (:meth:`HangJudge.pause`) counts for no rank.
* **Culprit**: the ranks not inside a collective while others wait in one (the stuck
  ones among them, else all: an endless loop moves); when every rank is in a
  collective, the ranks whose report index is behind; else the stuck ranks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lumos.train._internal.hang_sampler import Sample


@dataclass
class _Rank:
    sample: Sample
    progress_at: float


@dataclass(frozen=True)
class Finding:
    """The judge's verdict: the attempt hangs.

    Attributes:
        culprits: The ranks that hold the others up (sorted).
        stuck: Every rank without progress for the timeout (sorted).
        why: Per culprit, one phrase saying why it is the culprit.
        where: Per rank, its innermost user frame (``file:line in function``).
        stalled_s: How long the longest-stuck rank made no progress.
    """

    culprits: tuple[int, ...]
    stuck: tuple[int, ...]
    why: dict[int, str] = field(default_factory=dict)
    where: dict[int, str] = field(default_factory=dict)
    stalled_s: float = 0.0


class HangJudge:
    """Judges one attempt's ranks (see the module docstring).

    Args:
        world_size: The attempt's number of ranks.
        timeout_s: How long a rank may make no progress.
        per_rank: Expected waits pause only the waiting rank's clock (peer recovery).
    """

    def __init__(self, world_size: int, timeout_s: float, per_rank: bool = False) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.per_rank = per_rank
        self.ranks: dict[int, _Rank] = {}
        self.armed_at: float | None = None
        self.expected_at = float("-inf")

    def observe(self, rank: int, sample: Sample, now: float) -> None:
        """``rank``'s training thread looked like ``sample`` at ``now``."""
        old = self.ranks.get(rank)
        if old is None or (sample.moves, sample.reports) != (old.sample.moves, old.sample.reports):
            self.ranks[rank] = _Rank(sample, now)
        else:
            old.sample = sample
        position = sample.position
        expected = sample.phase == "setup" or position.exempt is not None
        if self.per_rank and (expected or position.collective is not None):
            self.ranks[rank].progress_at = now  # it waits for the others: they are judged
        elif expected:
            self.expected_at = now
        if self.armed_at is None and self._all_in_user():
            self.armed_at = now

    def pause(self, seconds: float) -> None:
        """The watchdog could not look for ``seconds`` (the driver was busy elsewhere,
        e.g. starting a worker): that time counts as no rank's stall. The samples in
        hand may be older than the gap, so every clock moves forward by it."""
        for r in self.ranks.values():
            r.progress_at += seconds
        if self.armed_at is not None:
            self.armed_at += seconds
        self.expected_at += seconds

    def forget(self, rank: int) -> None:
        """``rank``'s training function ended: it is no longer judged."""
        self.ranks.pop(rank, None)

    def _all_in_user(self) -> bool:
        return len(self.ranks) == self.world_size and all(
            r.sample.phase != "setup" for r in self.ranks.values()
        )

    def stuck(self, now: float) -> Finding | None:
        """The finding when some rank is stuck now, else ``None``."""
        if self.armed_at is None:
            return None
        base = max(self.armed_at, self.expected_at)
        idle = {
            rank: now - max(r.progress_at, base)
            for rank, r in self.ranks.items()
            if r.sample.phase == "user"
        }
        stuck = sorted(rank for rank, s in idle.items() if s >= self.timeout_s)
        if not stuck:
            return None
        culprits, why = self._culprits(stuck)
        where = {rank: r.sample.position.where for rank, r in sorted(self.ranks.items())}
        return Finding(tuple(culprits), tuple(stuck), why, where, max(idle[r] for r in stuck))

    def _culprits(self, stuck: list[int]) -> tuple[list[int], dict[int, str]]:
        ranks = self.ranks
        waiting = {
            r: c for r, v in ranks.items() if (c := v.sample.position.collective) is not None
        }
        if self.per_rank:  # a rank in an expected wait waits for the others too
            waiting |= {r: "an expected wait" for r, v in ranks.items() if v.sample.position.exempt}
        outside = sorted(r for r in ranks if r not in waiting)
        if waiting and outside:  # the stuck ones outside first, else the ones that move
            culprits = [r for r in outside if r in stuck] or outside
            text = (
                f"not inside a collective while rank(s) {sorted(waiting)} wait in "
                f"{', '.join(sorted(set(waiting.values())))}"
            )
            return culprits, {r: text for r in culprits}
        reports = {r: v.sample.reports for r, v in ranks.items()}
        low, high = min(reports.values()), max(reports.values())
        if low < high:
            behind = sorted(r for r, n in reports.items() if n == low)
            return behind, {r: f"report index {low} behind {high}" for r in behind}
        return stuck, {r: "no progress" for r in stuck}
