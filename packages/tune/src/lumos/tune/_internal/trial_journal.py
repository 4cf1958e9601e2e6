"""The trial journal: what happened to every trial, one typed record per event.

:class:`TrialJournal` is the only code that knows the record format; it writes the
records (buffered, through :class:`~lumos.tune._internal.journal.FsJournal`) and reads
them back when an experiment is restored. On disk each record is one JSON line::

    {"e": "start", "n": 3, "a": 0, "i": 0}               StartRecord
    {"e": "r", "n": 3, "i": 1, "m": {...}, "c": null}     ReportRecord
    {"e": "err", "n": 3, "a": 0, "type": ..., "msg": ..., "tb": ...}   ErrorRecord
    {"e": "end", "n": 3, "s": "TERMINATED"}               EndRecord
    {"e": "name", "n": 3, "name": ..., "dir": ...}         NameRecord
    {"e": "pbt", "n": 3, "d": 1, "i": 4, "c": ..., "old": {...}, "new": {...}, "ops": {...}}
                                                          ExploitRecord
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Union

from lumos.tune._internal.errors import TrialErrorRecord
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.trial import ExploitRecord, TrialStatus, trial_name

TRIALS_JOURNAL = "trials.journal"


@dataclass(frozen=True)
class StartRecord:
    """Attempt ``attempt`` of trial ``number`` was launched, resuming after its report
    ``resume_iteration`` (0: from the start; None: not recorded, older journals)."""

    number: int
    attempt: int
    resume_iteration: int | None = None


@dataclass(frozen=True)
class ReportRecord:
    """Trial ``number`` reported ``metrics`` as its ``iteration``-th report."""

    number: int
    iteration: int
    metrics: dict[str, Any]
    checkpoint_dir: str | None = None


@dataclass(frozen=True)
class ErrorRecord:
    """Trial ``number`` raised (or lost its actor)."""

    number: int
    error: TrialErrorRecord


@dataclass(frozen=True)
class EndRecord:
    """Trial ``number`` ended with ``status``."""

    number: int
    status: TrialStatus


@dataclass(frozen=True)
class NameRecord:
    """Trial ``number`` is called ``name`` and lives in ``dir_name`` (name creators)."""

    number: int
    name: str
    dir_name: str


JournalRecord = Union[StartRecord, ReportRecord, ErrorRecord, EndRecord, ExploitRecord, NameRecord]  # noqa: UP007


@dataclass
class TrialEvents:
    """Everything the journal holds about one trial, as :meth:`TrialJournal.replay` gives it."""

    starts: int = 0
    reports: list[ReportRecord] = field(default_factory=list)
    errors: list[TrialErrorRecord] = field(default_factory=list)
    end: EndRecord | None = None
    exploits: list[ExploitRecord] = field(default_factory=list)
    names: tuple[str, str] | None = None


_END_STATUS = {
    "TERMINATED": TrialStatus.TERMINATED,
    "PRUNED": TrialStatus.PRUNED,
    "ERROR": TrialStatus.ERROR,
}


def encode(record: JournalRecord) -> dict[str, Any]:
    """The JSON object of a record."""
    if isinstance(record, ReportRecord):
        return {
            "e": "r",
            "n": record.number,
            "i": record.iteration,
            "m": record.metrics,
            "c": record.checkpoint_dir,
        }
    if isinstance(record, StartRecord):
        if record.resume_iteration is None:
            return {"e": "start", "n": record.number, "a": record.attempt}
        return {"e": "start", "n": record.number, "a": record.attempt, "i": record.resume_iteration}
    if isinstance(record, NameRecord):
        return {"e": "name", "n": record.number, "name": record.name, "dir": record.dir_name}
    if isinstance(record, ExploitRecord):
        return {
            "e": "pbt",
            "n": record.number,
            "d": record.donor,
            "i": record.step,
            "c": record.checkpoint_dir,
            "old": record.old_config,
            "new": record.new_config,
            "ops": record.operations,
            "dc": record.donor_checkpoint,
        }
    if isinstance(record, ErrorRecord):
        err = record.error
        return {
            "e": "err",
            "n": record.number,
            "a": err.attempt,
            "type": err.exc_type,
            "msg": err.error_message,
            "tb": err.traceback,
        }
    return {"e": "end", "n": record.number, "s": record.status.value}


def decode(raw: dict[str, Any], last_iteration: int = 0) -> JournalRecord | None:
    """The record of a JSON object (None for one this version does not know).

    Args:
        raw: One journal line, parsed.
        last_iteration: The trial's previous report's iteration (a report without
            one counts as the next).
    """
    n = raw.get("n")
    if not isinstance(n, int):
        return None
    kind = raw.get("e")
    if kind == "r":
        return ReportRecord(
            n, int(raw.get("i", last_iteration + 1)), raw.get("m") or {}, raw.get("c") or None
        )
    if kind == "start":
        resume = raw.get("i")
        return StartRecord(n, int(raw.get("a", 0)), int(resume) if resume is not None else None)
    if kind == "err":
        error = TrialErrorRecord(
            trial_name(n),
            int(raw.get("a", 0)),
            str(raw.get("type", "Error")),
            str(raw.get("msg", "")),
            str(raw.get("tb", "")),
        )
        return ErrorRecord(n, error)
    if kind == "name":
        return NameRecord(n, str(raw.get("name", "")), str(raw.get("dir", "")))
    if kind == "pbt":
        return ExploitRecord(
            n,
            int(raw.get("d", -1)),
            int(raw.get("i", 0)),
            str(raw.get("c", "")),
            dict(raw.get("old") or {}),
            dict(raw.get("new") or {}),
            dict(raw.get("ops") or {}),
            str(raw.get("dc", "")),
        )
    if kind == "end":
        return EndRecord(n, _END_STATUS.get(str(raw.get("s")), TrialStatus.TERMINATED))
    return None


class TrialJournal:
    """Writes and reads the trial journal (see the module docstring for the format).

    Args:
        journal: The append-only file the records live in.

    Example:
        >>> journal = TrialJournal(FsJournal(fs, "/runs/sweep/_lumos/trials.journal"))
        >>> journal.append(StartRecord(number=0, attempt=0))
        >>> journal.flush()
        >>> journal.replay()[0].starts
        1
    """

    def __init__(self, journal: FsJournal) -> None:
        self.journal = journal

    def append(self, *records: JournalRecord) -> None:
        """Buffer records (written by the next :meth:`flush`)."""
        self.journal.append(encode(r) for r in records)

    def extend(self, records: Iterable[JournalRecord]) -> None:
        """Buffer every record of ``records``."""
        self.journal.append(encode(r) for r in records)

    def read(self) -> list[JournalRecord]:
        """Every record written so far, in order (unknown ones skipped)."""
        out: list[JournalRecord] = []
        last: dict[int, int] = {}
        for raw in self.journal.read():
            n = raw.get("n")
            record = decode(raw, last.get(n, 0) if isinstance(n, int) else 0)
            if record is None:
                continue
            if isinstance(record, ReportRecord):
                last[record.number] = record.iteration
            out.append(record)
        return out

    def replay(self) -> dict[int, TrialEvents]:
        """What the journal holds, per trial number."""
        by_number: dict[int, TrialEvents] = {}
        for record in self.read():
            events = by_number.setdefault(record.number, TrialEvents())
            if isinstance(record, StartRecord):
                events.starts += 1
            elif isinstance(record, ReportRecord):
                events.reports.append(record)
            elif isinstance(record, ErrorRecord):
                events.errors.append(record.error)
            elif isinstance(record, ExploitRecord):
                events.exploits.append(record)
            elif isinstance(record, NameRecord):
                events.names = (record.name, record.dir_name)
            else:
                events.end = record
        return by_number

    def flush(self, force: bool = True) -> bool:
        """Write the buffered records (see ``FsJournal.flush``)."""
        return self.journal.flush(force)

    def close(self) -> None:
        """Flush and close."""
        self.journal.close()


def histories(records: Iterable[JournalRecord]) -> dict[int, list[dict[str, Any]]]:
    """Every trial's reports as the driver kept them, rebuilt from the journal's records.

    The driver's rules, replayed: a start of a trial that has reports keeps those up to
    the report it resumes after (none for a retry from scratch; journals that did not
    record it: up to its latest checkpoint), and a report of an iteration already seen
    replaces that iteration and those after it.
    """
    rows: dict[int, list[dict[str, Any]]] = {}
    last: dict[int, int] = {}
    checkpoint: dict[int, int] = {}
    for record in records:
        n = record.number
        if isinstance(record, StartRecord):
            kept = rows.get(n)
            if kept:
                upto = record.resume_iteration
                if upto is None:
                    upto = checkpoint.get(n)
                rows[n] = (
                    [r for r in kept if int(r.get(ITERATION_KEY, 0)) <= upto]
                    if upto is not None
                    else []
                )
                last[n] = upto or 0
        elif isinstance(record, ReportRecord):
            trial_rows = rows.setdefault(n, [])
            if trial_rows and record.iteration <= last.get(n, 0):
                trial_rows = rows[n] = [
                    r for r in trial_rows if int(r.get(ITERATION_KEY, 0)) < record.iteration
                ]
            trial_rows.append(record.metrics)
            last[n] = record.iteration
            if record.checkpoint_dir is not None:
                checkpoint[n] = record.iteration
    return rows


class StoredHistories:
    """The reports of finished trials, read back from the trial journal when asked for.

    The driver drops a finished trial's reports (:meth:`LiveTrial.compact`): this
    reads the journal once, on the first request, and keeps what it read; a trial it
    does not know yet (it ended since) makes it read again.

    Args:
        journal: The experiment's trial journal (its buffer is written first).
    """

    def __init__(self, journal: TrialJournal) -> None:
        self._journal = journal
        self._rows: dict[int, list[dict[str, Any]]] = {}

    def __call__(self, number: int) -> list[dict[str, Any]]:
        """Trial ``number``'s reports, in order (a new list)."""
        if number not in self._rows:
            writer = self._journal.journal
            if writer.writable and writer.pending:
                writer.flush()
            reader = FsJournal(writer.fs, writer.path, writable=False)
            self._rows = histories(TrialJournal(reader).read())
        return list(self._rows.get(number, ()))
