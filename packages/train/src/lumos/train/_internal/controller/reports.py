"""ReportAggregator: turns the ranks' reports into checkpoint commits (pure: no I/O).

Every rank calls ``train.report()`` the same number of times; report ``#i`` of a
run is complete once every rank sent it. A complete report in which at least one
rank passed a checkpoint becomes a :class:`Commit` once every rank's background
upload of it (ASYNC) finished too. Commits come out strictly in report order: a
later report whose uploads finish first waits for the earlier ones. The controller
writes each commit (``RunBook.commit``) and sends the commit notice to the ranks.

The aggregator also catches the ways ranks can misuse checkpoint names, which no
retry can fix (``CheckpointReportError``): different ``checkpoint_dir_name`` values
for one report, a name already used by a committed (or another pending) checkpoint,
and a rank that returned without sending a report that others sent with a checkpoint.

Peer recovery (``TorchftConfig``) replaces a dead rank while the others keep
reporting: :meth:`ReportAggregator.excuse` stops waiting for it, and its replacement
counts again from the first report it sends (the index it got from a live peer). A
rank that took the state from a peer (a replacement, or a slow rank torchft left out
of a few steps) skips the reports it missed: a jump in its report indices excuses it
from the skipped ones (:class:`_Members`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lumos.train._internal.errors import CheckpointReportError
from lumos.train._internal.wire import RankReport


@dataclass(frozen=True)
class Commit:
    """A complete report with a checkpoint: what the controller commits.

    Attributes:
        index: The report's index in the run.
        dir_name: The checkpoint directory every uploading rank wrote into.
        metrics: Rank 0's metrics of that report.
        ranks: The ranks that passed a checkpoint.
        data_positions: Every rank's data-loader positions at that report (ranks that
            have loaders), stored with the checkpoint before it commits.
        validation: The validation the report asks for (rank 0's request, else the
            first rank's that made one), or ``None``.
    """

    index: int
    dir_name: str
    metrics: dict[str, Any]
    ranks: tuple[int, ...]
    data_positions: dict[int, bytes] = field(default_factory=dict, repr=False)
    validation: dict[str, Any] | None = None


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


class _Members:
    """Which ranks a report waits for (pure): all, but the absent ones and the ranks
    whose report indices jumped over it."""

    def __init__(self, world_size: int, base: int) -> None:
        self.world_size = world_size
        self.base = base
        self.absent: set[int] = set()  # replaced; the replacement has not reported yet
        self._last: dict[int, int] = {}  # every rank's latest report index
        self._skipped: dict[int, list[range]] = {}
        self.gaps = False  # a jump excuses (peer recovery on); else ranks report in step

    def reported(self, rank: int, index: int) -> bool:
        """Record ``rank``'s report ``index``; True when it jumped over earlier ones."""
        self.absent.discard(rank)
        previous = self._last.get(rank, self.base - 1)
        self._last[rank] = max(previous, index)
        if not self.gaps or index <= previous + 1:
            return False
        self._skipped.setdefault(rank, []).append(range(previous + 1, index))
        return True

    def excused(self, rank: int, index: int) -> bool:
        """Whether report ``index`` does not wait for ``rank``."""
        return rank in self.absent or any(index in r for r in self._skipped.get(rank, ()))

    def complete(self, index: int, reported: dict[int, RankReport]) -> bool:
        """Whether every rank that report ``index`` waits for sent it (a report of a rank
        excused since does not stand in for another rank's)."""
        if not self.absent and not self._skipped:
            return len(reported) >= self.world_size  # always so without peer recovery
        return all(
            rank in reported for rank in range(self.world_size) if not self.excused(rank, index)
        )


class ReportAggregator:
    """Collects one attempt's reports of ranks ``0 .. world_size - 1``.

    Args:
        world_size: The number of ranks in the attempt.
        committed_names: Names of the run's checkpoints committed before the attempt.

    Example:
        >>> agg = ReportAggregator(world_size=2)
        >>> agg.add(0, RankReport(0, {"loss": 1.0}, "ckpt"))
        []
        >>> agg.add(1, RankReport(0, {"loss": 1.1}, "ckpt"))
        [Commit(index=0, dir_name='ckpt', metrics={'loss': 1.0}, ranks=(0, 1))]
    """

    def __init__(self, world_size: int, committed_names: Iterable[str] = (), base: int = 0) -> None:
        self.world_size = world_size
        self._committed = set(committed_names)
        self._pending: dict[int, _Pending] = {}
        self._waiting: dict[int, tuple[Commit, set[int]]] = {}  # complete, uploads pending
        self._uploaded_early: set[tuple[int, int]] = set()
        self._finished: set[int] = set()
        self._members = _Members(world_size, base)
        self._closed: set[int] = set()  # complete reports (under peer recovery)
        self._closed_bare: set[int] = set()  # ... of them, those without a checkpoint
        self._commit_high = base - 1  # the highest report index that became a commit
        self._rows: list[tuple[int, dict[str, Any]]] = []  # their history rows, in order

    def follow_peer_recovery(self) -> None:
        """Peer recovery is on: a rank whose report indices jump (it took a live peer's
        state and its report count) is excused from the reports it skipped, and each
        report's history row comes when it completes (:meth:`take_rows`)."""
        self._members.gaps = True

    @property
    def follows_peers(self) -> bool:
        """Whether peer recovery is on (rows come from :meth:`take_rows`)."""
        return self._members.gaps

    def take_rows(self) -> list[tuple[int, dict[str, Any]]]:
        """Peer recovery: the history rows ``(index, metrics)`` of the reports completed
        since the last call, in report order: rank 0's metrics, or the lowest rank's
        while rank 0 was excused from it (dead, vacant, or it skipped it)."""
        rows, self._rows = self._rows, []
        return rows

    def excuse(self, rank: int) -> list[Commit]:
        """Stop waiting for ``rank`` (its worker died; a replacement joins later), or
        for a new rank (``>= world_size``: the attempt grows) until it reports.

        Returns:
            The commits released by no longer waiting for it, in report order.
        """
        self.world_size = self._members.world_size = max(self.world_size, rank + 1)
        self._members.absent.add(rank)
        for pending in self._pending.values():  # its unfinished upload never finishes
            mine = pending.by_rank.get(rank)
            if mine is not None and mine.upload_pending:
                del pending.by_rank[rank]
        for index, (_, uploading) in list(self._waiting.items()):
            if rank in uploading:  # a checkpoint missing its files is never committed
                del self._waiting[index]
        return self._recheck() + self._release()

    def _recheck(self) -> list[Commit]:
        """The commits of pending reports that no longer wait for a rank."""
        out: list[Commit] = []
        for index in sorted(self._pending):
            if index in self._pending:
                out += self._complete(self._pending[index])
        return out

    def add(self, rank: int, report: RankReport) -> list[Commit]:
        """Record ``rank``'s report.

        Returns:
            The commits this report releases, in report order (often none).

        Raises:
            CheckpointReportError: the ranks disagree about this report's checkpoint,
                or its name is already used by another checkpoint of the run.
        """
        released = self._recheck() if self._members.reported(rank, report.index) else []
        if report.index in self._closed:  # completed without this rank (excused then)
            return released + self._late(rank, report)
        if report.checkpoint_dir_name is not None:
            self._check_name_free(report.index, report.checkpoint_dir_name)
        pending = self._pending.get(report.index)
        if pending is None:
            pending = self._pending[report.index] = _Pending(report.index)
        pending.by_rank[rank] = report
        if report.checkpoint_dir_name is not None:
            self._check_reportable(pending)
        return released + self._complete(pending)

    def _complete(self, pending: _Pending) -> list[Commit]:
        """The commits ``pending`` releases once every rank it waits for reported it."""
        if not self._members.complete(pending.index, pending.by_rank):
            return []
        del self._pending[pending.index]
        if self._members.gaps:  # a late report of it (peer recovery) is dropped
            self._closed.add(pending.index)
            if pending.by_rank:
                self._rows.append((pending.index, pending.by_rank[min(pending.by_rank)].metrics))
        if not pending.has_checkpoint():
            if self._members.gaps:
                self._closed_bare.add(pending.index)
            return []
        return self._queue(pending)

    def _late(self, rank: int, report: RankReport) -> list[Commit]:
        """A report of an index that completed while ``rank`` was excused: dropped, unless
        it brings that report's only checkpoint and no later report committed yet. Then
        it commits alone: a replacement's first report can be the checkpoint of a report
        the other ranks sent without one (each with its own history row already), and a
        SYNC report waits for its commit."""
        name = report.checkpoint_dir_name
        if name is None or report.index not in self._closed_bare:
            return []
        if report.index <= self._commit_high:
            return []  # the commits are in report order: this one can no longer be
        self._check_name_free(report.index, name)
        self._closed_bare.discard(report.index)
        return self._queue(_Pending(report.index, {rank: report}))

    def _queue(self, pending: _Pending) -> list[Commit]:
        """A complete report with a checkpoint: a commit once its uploads finished."""
        commit = _commit_of(pending)
        self._commit_high = max(self._commit_high, commit.index)
        uploading = {
            r
            for r, rep in pending.by_rank.items()
            if rep.upload_pending and (commit.index, r) not in self._uploaded_early
        }
        self._uploaded_early -= {(commit.index, r) for r in pending.by_rank}
        self._waiting[commit.index] = (commit, uploading)
        return self._release()

    def uploaded(self, rank: int, index: int) -> list[Commit]:
        """Record that ``rank``'s background upload of report ``index`` finished.

        Returns:
            The commits this releases, in report order.
        """
        entry = self._waiting.get(index)
        if entry is None:
            self._uploaded_early.add((index, rank))  # its report is not complete yet
            return []
        entry[1].discard(rank)
        return self._release()

    def in_flight(self) -> list[int]:
        """Indices of complete reports whose uploads have not all finished."""
        return sorted(self._waiting)

    def _release(self) -> list[Commit]:
        out: list[Commit] = []
        for index in sorted(self._waiting):
            commit, uploading = self._waiting[index]
            if uploading:
                break  # commits stay in report order
            del self._waiting[index]
            self._committed.add(commit.dir_name)
            out.append(commit)
        return out

    def _check_name_free(self, index: int, name: str) -> None:
        """A name of a committed checkpoint, or of another pending report, is refused."""
        if name in self._committed:
            raise CheckpointReportError(
                f"train.report() #{index} reuses checkpoint_dir_name={name!r}, the name of a "
                "committed checkpoint of this run; checkpoint names must be unique in a run, "
                "so that a committed checkpoint never changes"
            )
        others = [
            i for i, p in self._pending.items() if i != index and name in p.dir_names().values()
        ] + [i for i, (c, _) in self._waiting.items() if i != index and c.dir_name == name]
        if others:
            raise CheckpointReportError(
                f"train.report() #{index} reuses checkpoint_dir_name={name!r}, the name of "
                f"report #{others[0]}'s checkpoint, which is not committed yet; checkpoint "
                "names must be unique in a run"
            )

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
        missing = sorted(
            r
            for r in self._finished - set(pending.by_rank)
            if not self._members.excused(r, pending.index)
        )
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
            f"across ranks ({detail}); every rank that passes a checkpoint must pass the "
            "same checkpoint_dir_name for one report"
        )
    rank0 = pending.by_rank.get(0) or pending.by_rank[min(pending.by_rank)]
    requests = [
        r.validation for _, r in sorted(pending.by_rank.items()) if r.validation is not None
    ]
    return Commit(
        index=pending.index,
        dir_name=next(iter(names.values())),
        metrics=rank0.metrics if rank0 is not None else {},
        ranks=tuple(sorted(names)),
        data_positions={
            rank: r.data_positions
            for rank, r in pending.by_rank.items()
            if r.data_positions is not None
        },
        validation=requests[0] if requests else None,
    )
