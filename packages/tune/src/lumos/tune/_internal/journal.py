"""Append-only journals on any fsspec filesystem, and the Optuna study kept in one.

Every change of the experiment is a small JSON record. Records are buffered in
memory and written in batches (:meth:`FsJournal.flush`), so the per-trial path
of the driver does no file I/O of its own; the driver flushes once per loop
iteration in which a trial finished, and at least every ``flush_interval_s``.

* Local filesystems: one JSON-lines file, appended with ``O_APPEND``. A torn
  last line (the driver was killed mid-write) is cut off when the journal is
  opened again. This is the exact format of Optuna's ``JournalFileBackend``, so
  the study journal opens in ``optuna-dashboard <file>`` as it is.
* Other filesystems (object stores have no append): each flush writes one
  immutable chunk ``<path>.d/<seq>.jsonl``; reading concatenates the chunks in
  order. :func:`export_study_journal` merges them into one local file.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Iterable
from typing import Any

from fsspec import AbstractFileSystem
from optuna.storages.journal import BaseJournalBackend

from lumos.storage import is_local, json_default

STUDY_JOURNAL = "study.journal"


def dumps(record: Any) -> str:
    """One journal line (no newline); Optuna's separators."""
    return json.dumps(record, separators=(",", ":"), default=json_default)


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
        self._fd: int | None = None
        self._next_chunk = 0
        self._last_flush = 0.0

    @property
    def chunk_dir(self) -> str:
        """Folder of the chunk files (non-local filesystems)."""
        return self.path + ".d"

    def exists(self) -> bool:
        """Whether anything was ever written."""
        if self.local:
            return os.path.exists(self.path)
        try:
            return bool(self.fs.ls(self.chunk_dir, detail=False))
        except FileNotFoundError:
            return False

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far (repairs a torn tail on local files)."""
        if self.local:
            return self._read_local()
        records: list[dict[str, Any]] = []
        try:
            self.fs.invalidate_cache(self.chunk_dir)
            names = sorted(self.fs.ls(self.chunk_dir, detail=False))
        except FileNotFoundError:
            names = []
        for name in names:
            base = posixpath.basename(name)
            if not base.endswith(".jsonl"):
                continue
            self._next_chunk = max(self._next_chunk, int(base.split(".")[0]) + 1)
            text = self.fs.cat_file(name).decode("utf-8")
            records.extend(json.loads(line) for line in text.splitlines() if line.strip())
        return records

    def _read_local(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end != len(data):
            if self.writable:
                # A driver died mid-write: drop the partial last line before appending again.
                with open(self.path, "r+b") as f:
                    f.truncate(end)
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
        if self.local:
            if self._fd is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        else:
            name = posixpath.join(self.chunk_dir, f"{self._next_chunk:010d}.jsonl")
            self.fs.pipe_file(name, data)
            self._next_chunk += 1
        self._buffer.clear()
        self._last_flush = now
        return True

    def close(self) -> None:
        """Flush, fsync (local) and close."""
        self.flush()
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


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

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        if log_number_from >= len(self._logs):
            return []
        return self._logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._logs.extend(logs)
        self.journal.append(logs)


def export_study_journal(journal: FsJournal, local_path: str) -> str:
    """Write the study journal as one local file that ``optuna-dashboard`` opens."""
    records = journal.read()
    os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
    with open(local_path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(dumps(record) + "\n")
    return local_path
