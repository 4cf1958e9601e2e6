"""ReportAggregator: turns the ranks' reports into checkpoint commits (pure: no I/O).

Every rank calls ``train.report()`` the same number of times; report ``#i`` of a
run is complete once every rank sent it. A complete report in which at least one
rank persisted checkpoint files becomes a :class:`Commit`; the controller writes
it (``RunBook.commit``) and acknowledges it to the ranks that wait for it.

The aggregator also catches the two ways ranks can disagree about a checkpoint,
which no retry can fix (``CheckpointReportError``): different
``checkpoint_dir_name`` values for one report, and a rank that returned without
sending a report that others sent with a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lumos.train._internal.errors import CheckpointReportError
from lumos.train._internal.session import RankReport


@dataclass(frozen=True)
class Commit:
    """A complete report with a checkpoint: what the controller commits.

    Attributes:
        index: The report's index in the run.
        dir_name: The checkpoint directory every uploading rank wrote into.
        metrics: Rank 0's metrics of that report.
        ranks: The ranks that uploaded files and wait for the commit.
    """

    index: int
    dir_name: str
    metrics: dict[str, Any]
    ranks: tuple[int, ...]


@dataclass
class _Pending:
    index: int
    by_rank: dict[int, RankReport] = field(default_factory=dict)

    def has_checkpoint(self) -> bool:
        return any(r.checkpoint_dir_name is not None for r in self.by_rank.values())

    def dir_names(self) -> dict[int, str]:
        return {
            rank: r.checkpoint_dir_name
            for rank, r in self.by_rank.items()
            if r.checkpoint_dir_name is not None
        }


class ReportAggregator:
    """Collects one attempt's reports of ranks ``0 .. world_size - 1``.

    Args:
        world_size: The number of ranks in the attempt.

    Example:
        >>> agg = ReportAggregator(world_size=2)
        >>> agg.add(0, RankReport(0, {"loss": 1.0}, "ckpt")) is None
        True
        >>> agg.add(1, RankReport(0, {"loss": 1.1}, "ckpt"))
        Commit(index=0, dir_name='ckpt', metrics={'loss': 1.0}, ranks=(0, 1))
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[int, _Pending] = {}
        self._finished: set[int] = set()

    def add(self, rank: int, report: RankReport) -> Commit | None:
        """Record ``rank``'s report.

        Returns:
            The commit when this report completes one with a checkpoint, else ``None``.

        Raises:
            CheckpointReportError: the ranks disagree about this report's checkpoint.
        """
        pending = self._pending.get(report.index)
        if pending is None:
            pending = self._pending[report.index] = _Pending(report.index)
        pending.by_rank[rank] = report
        if len(pending.by_rank) >= self.world_size:
            del self._pending[report.index]
            return _commit_of(pending) if pending.has_checkpoint() else None
        if report.checkpoint_dir_name is not None:
            self._check_reportable(pending)
        return None

    def finished(self, rank: int) -> None:
        """Record that ``rank``'s training function returned.

        Raises:
            CheckpointReportError: a report with a checkpoint waits for this rank,
                which will never send it.
        """
        self._finished.add(rank)
        for pending in list(self._pending.values()):
            self._check_reportable(pending)

    def _check_reportable(self, pending: _Pending) -> None:
        """A checkpoint that a finished rank never reported can never commit."""
        if not pending.has_checkpoint():
            return
        missing = sorted(self._finished - set(pending.by_rank))
        if missing:
            raise CheckpointReportError(
                f"rank(s) {missing} returned without calling train.report() for report "
                f"#{pending.index}, which rank(s) {sorted(pending.by_rank)} reported "
                "with a checkpoint; every rank must call train.report() the same "
                "number of times (pass checkpoint=None on ranks that save nothing)"
            )


def _commit_of(pending: _Pending) -> Commit:
    names = pending.dir_names()
    if len(set(names.values())) > 1:
        detail = ", ".join(f"rank {r}: {d!r}" for r, d in sorted(names.items()))
        raise CheckpointReportError(
            f"train.report() #{pending.index} got different checkpoint_dir_name values "
            f"across ranks ({detail}); every rank must pass the same "
            "checkpoint_dir_name (or none) for one report"
        )
    rank0 = pending.by_rank.get(0)
    return Commit(
        index=pending.index,
        dir_name=next(iter(names.values())),
        metrics=rank0.metrics if rank0 is not None else {},
        ranks=tuple(sorted(names)),
    )
