"""Append-only journals on any fsspec filesystem, and the Optuna study kept in one.

Every change of the experiment is a small JSON record. Records are buffered in
memory and written in batches (:meth:`FsJournal.flush`), so the per-trial path
of the driver does no file I/O of its own; the driver flushes once per loop
iteration in which a trial finished, and at least every ``flush_interval_s``.

* Local filesystems: one JSON-lines file, appended with ``O_APPEND``
  (``lumos.storage.AppendOnlyFile``: a retried append that failed part-way is cut
  off before it is written again, so no record lands twice). A torn last line (the
  driver was killed mid-write) is cut off when the journal is opened again. This is the exact format of Optuna's ``JournalFileBackend``, so
  the study journal opens in ``optuna-dashboard <file>`` as it is.
* Other filesystems (object stores have no append): each flush writes one
  immutable chunk ``<path>.d/<seq>.jsonl``; reading concatenates the chunks in
  order. :func:`export_study_journal` merges them into one local file. A retried
  flush PUTs the same chunk again (a whole-object write is idempotent), and a flush
  that failed for good keeps its records buffered for the same chunk name.

Every read and write goes through lumos-storage's retried helpers: transient errors
(throttling, resets, timeouts) are retried; a permanent one raises ``StorageIOError``.
"""

from __future__ import annotations

import copy
import json
import posixpath
import sys
import time
from collections.abc import Container, Iterable, Sequence
from typing import Any

from fsspec import AbstractFileSystem
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from lumos.storage import (
    AppendOnlyFile,
    is_local,
    json_default,
    resolve_filesystem,
    retried_exists,
    retried_ls,
    retried_read,
    retried_write,
)
from lumos.tune._internal.optuna_bridge import journal_trials, trial_id_of

STUDY_JOURNAL = "study.journal"


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default)


def dumps(record: Any) -> str:
    """One journal line (no newline); Optuna's separators."""
    return _ENCODER.encode(record)


class FsJournal:
    """A buffered append-only JSON-lines journal at ``path`` on ``fs``.

    Args:
        fs: The filesystem.
        path: The journal's path (a file on local filesystems, a chunk folder prefix elsewhere).
        flush_interval_s: Minimum seconds between flushes on non-local filesystems
            unless forced (each flush there is one object PUT).
        writable: False for readers (another process may be writing): a torn last
            line is then skipped, never cut off, and nothing is written.
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        path: str,
        flush_interval_s: float = 0.5,
        writable: bool = True,
    ) -> None:
        self.fs = fs
        self.path = path
        self.writable = writable
        self.local = is_local(fs)
        self.flush_interval_s = 0.0 if self.local else flush_interval_s
        self._buffer: list[str] = []
        self._file = AppendOnlyFile(path) if self.local and writable else None
        self._next_chunk = 0
        self._last_flush = 0.0

    @property
    def chunk_dir(self) -> str:
        """Folder of the chunk files (non-local filesystems)."""
        return self.path + ".d"

    def exists(self) -> bool:
        """Whether anything was ever written."""
        if self.local:
            return retried_exists(self.fs, self.path)
        return bool(retried_ls(self.fs, self.chunk_dir))

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far (repairs a torn tail on local files)."""
        if self.local:
            return self._read_local()
        records: list[dict[str, Any]] = []
        for name in sorted(str(n) for n in retried_ls(self.fs, self.chunk_dir)):
            base = posixpath.basename(name)
            if not base.endswith(".jsonl"):
                continue
            self._next_chunk = max(self._next_chunk, int(base.split(".")[0]) + 1)
            data = retried_read(self.fs, name)
            if data is None:  # listed, then gone: chunks are never deleted, so never here
                continue
            text = data.decode("utf-8")
            records.extend(json.loads(line) for line in text.splitlines() if line.strip())
        return records

    def _read_local(self) -> list[dict[str, Any]]:
        data = retried_read(self.fs, self.path)
        if data is None:
            return []
        end = data.rfind(b"\n") + 1
        if end != len(data):
            if self._file is not None:
                # A driver died mid-write: drop the partial last line before appending again.
                self._file.truncate(end)
            data = data[:end]
        records: list[dict[str, Any]] = []
        for line in data.splitlines():
            if line.strip():
                records.append(json.loads(line))
        return records

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Buffer records (written by the next :meth:`flush`)."""
        self._buffer.extend(dumps(r) for r in records)

    @property
    def pending(self) -> int:
        """Records buffered and not yet written."""
        return len(self._buffer)

    def flush(self, force: bool = True) -> bool:
        """Write the buffered records. Returns whether anything was written.

        Args:
            force: Write even if the last flush was less than ``flush_interval_s`` ago.
        """
        if not self._buffer:
            return False
        if not self.writable:
            raise RuntimeError(f"journal {self.path!r} was opened read-only")
        now = time.monotonic()
        if not force and now - self._last_flush < self.flush_interval_s:
            return False
        data = ("\n".join(self._buffer) + "\n").encode("utf-8")
        # Failing for good raises StorageIOError with the records still buffered.
        if self._file is not None:
            self._file.append(data)  # cut back and rewritten whole on a retry: once
        else:
            name = posixpath.join(self.chunk_dir, f"{self._next_chunk:010d}.jsonl")
            retried_write(self.fs, name, data)  # one whole PUT: a retry repeats it
            self._next_chunk += 1
        self._buffer.clear()
        self._last_flush = now
        return True

    def close(self) -> None:
        """Flush, fsync (local) and close."""
        self.flush()
        if self._file is not None:
            self._file.close()


class StudyJournalBackend(BaseJournalBackend):
    """An Optuna journal backend over :class:`FsJournal` (single writer: the driver).

    Optuna's ``JournalStorage`` replays the logs into its in-memory model; this
    backend keeps the logs in memory too and hands new ones to the journal,
    which writes them in batches.

    Example:
        >>> journal = FsJournal(fs, "/runs/sweep/_lumos/study.journal")
        >>> storage = optuna.storages.JournalStorage(StudyJournalBackend(journal))
    """

    def __init__(self, journal: FsJournal) -> None:
        self.journal = journal
        self._logs: list[dict[str, Any]] = journal.read()
        self._first = 0  # the number of ``self._logs[0]``: logs before it were read and dropped

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        # One reader (the JournalStorage over this backend) reads every log once, in
        # order: what it has read is dropped, so the driver's memory stays flat.
        start = log_number_from - self._first
        if start < 0:
            raise RuntimeError(
                f"study journal logs before #{self._first} were already read and dropped; "
                f"open a new StudyJournalBackend to read from #{log_number_from}"
            )
        if start:
            del self._logs[:start]
            self._first = log_number_from
        return self._logs[:] if self._logs else []

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._logs.extend(logs)
        self.journal.append(logs)

    @property
    def held(self) -> int:
        """Logs kept in memory: appended and not yet read back by the storage."""
        return len(self._logs)


class StudyStorage(JournalStorage):
    """Optuna's ``JournalStorage`` whose ``study.ask()`` costs O(1), not O(trials), and
    whose finished trials cost a third of the memory.

    ``Study.ask`` first looks for an enqueued (WAITING) trial, which Optuna's journal
    storage finds by scanning every trial of the study: quadratic over a sweep. This
    storage keeps the ids of the trials it created WAITING (the driver is the only
    writer) and answers that one query from them.

    Optuna keeps every trial of the study in memory, and a finished trial as it was
    last copied: its own distribution objects, three empty dicts and an attribute dict
    of its own (about 1.3 KB for one float parameter). Once a trial is finished (Optuna
    never changes it again) it is replaced by an equal one that shares its
    distributions, parameter names and empty dicts with the other trials (about
    0.5 KB): a 10,000-trial sweep keeps the driver's memory flat.

    Example:
        >>> storage = StudyStorage(StudyJournalBackend(journal))
    """

    def __init__(self, backend: StudyJournalBackend) -> None:
        super().__init__(backend)
        self._waiting: dict[int, set[int]] = {}
        self._shared = _SharedParts()
        for study in self.get_all_studies():
            sid = self.get_study_id_from_name(study.study_name)
            waiting = super().get_all_trials(sid, deepcopy=False, states=_WAITING)
            self._waiting[sid] = {trial_id_of(t) for t in waiting}
            for trial in super().get_all_trials(sid, deepcopy=False, states=_FINISHED):
                self._slim(trial_id_of(trial))

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        changed = super().set_trial_state_values(trial_id, state, values)
        if state.is_finished():
            self._slim(trial_id)
        return changed

    def _slim(self, trial_id: int) -> None:
        """Replace finished trial ``trial_id`` of Optuna's in-memory model by its slim twin."""
        trials = journal_trials(self)
        with self._thread_lock:
            trial = trials.get(trial_id)
            if trial is not None and trial.state.is_finished():
                trials[trial_id] = self._shared.slim(trial)

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        study_id = super().create_new_study(directions, study_name)
        self._waiting[study_id] = set()
        return study_id

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        trial_id = super().create_new_trial(study_id, template_trial)
        if template_trial is not None and template_trial.state == TrialState.WAITING:
            self._waiting.setdefault(study_id, set()).add(trial_id)
        return trial_id

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        if states is None or not _only_waiting(states) or study_id not in self._waiting:
            return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)
        waiting = self._waiting[study_id]
        out: list[FrozenTrial] = []
        for trial_id in sorted(waiting):
            trial = self.get_trial(trial_id)
            if trial.state == TrialState.WAITING:
                out.append(trial)
            else:
                waiting.discard(trial_id)
        return copy.deepcopy(out) if deepcopy else out


_WAITING = (TrialState.WAITING,)
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class _SharedParts:
    """What finished trials can share: equal distribution dicts, parameter names and
    the empty dict (Optuna replaces a trial's dicts on every update, never changes one
    in place, and never updates a finished trial)."""

    def __init__(self) -> None:
        self._distributions: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
        self._names: dict[str, str] = {}
        self._empty: dict[Any, Any] = {}
        self._key_sharing: type = type("_KeySharing", (), {"__slots__": ("__dict__",)})
        self._plain_sizes: dict[int, int] = {}

    def distributions(self, distributions: dict[str, Any]) -> dict[str, Any]:
        key = tuple(distributions.items())
        try:
            return self._distributions.setdefault(key, {self.name(k): d for k, d in key})
        except TypeError:  # an unhashable distribution (odd categorical choices): keep it
            return distributions

    def name(self, name: str) -> str:
        return self._names.setdefault(name, name)

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """An equal dict, its keys table shared with the other trials' params if that
        makes it smaller.

        An ordinary ``dict``, taken from an instance's ``__dict__``: CPython keeps the
        keys of all instances of a class in one table (PEP 412) and such a dict holds
        just its values, about half the memory of a dict of its own once a sweep has
        a few dozen trials (a 10,000-trial sweep keeps one per trial, shared with the
        trial's ``config``). One class per storage, so the table holds this sweep's
        names only; a dict that would not be smaller (keys that are not identifiers,
        or many names) is a plain one.
        """
        shared: dict[str, Any] = self._key_sharing().__dict__
        for key, value in params.items():
            shared[self.name(key)] = value
        if sys.getsizeof(shared) < self._plain_size(len(shared)):
            return shared
        return {k: v for k, v in shared.items()}  # (a comprehension builds a plain dict)

    def _plain_size(self, length: int) -> int:
        """The size of a plain dict of ``length`` string keys (it depends on nothing else)."""
        size = self._plain_sizes.get(length)
        if size is None:
            size = self._plain_sizes[length] = sys.getsizeof({str(i): 0 for i in range(length)})
        return size

    def dict_or_empty(self, d: dict[Any, Any]) -> dict[Any, Any]:
        return d if d else self._empty

    def slim(self, trial: FrozenTrial) -> FrozenTrial:
        """An equal trial built by its constructor (a compact attribute layout)."""
        return FrozenTrial(
            number=trial.number,
            state=trial.state,
            value=None,
            values=trial.values,
            datetime_start=trial.datetime_start,
            datetime_complete=trial.datetime_complete,
            params=self.params(trial.params),
            distributions=self.distributions(trial.distributions),
            user_attrs=self.dict_or_empty(trial.user_attrs),
            system_attrs=self.dict_or_empty(trial.system_attrs),
            intermediate_values=self.dict_or_empty(trial.intermediate_values),
            trial_id=trial_id_of(trial),
        )


def _only_waiting(states: Container[TrialState]) -> bool:
    if not isinstance(states, (tuple, list, set, frozenset)):
        return False
    return len(states) == 1 and TrialState.WAITING in states


def export_study_journal(journal: FsJournal, local_path: str) -> str:
    """Write the study journal as one local file that ``optuna-dashboard`` opens."""
    records = journal.read()
    text = "".join(dumps(record) + "\n" for record in records)
    local_fs, path = resolve_filesystem(local_path)
    retried_write(local_fs, path, text.encode("utf-8"))
    return local_path
