"""Folding the report history's small chunks into segments, so a long run stays a few files.

Train writes the history a chunk at a time (every 200 rows, or every 2 s of a slow
run), so 100,000 reports are 500 files and a day of slow steps tens of thousands;
on an object store each is a request for every reader. :class:`HistoryWriter` keeps
the rows of the segment it is filling (at most :data:`SEGMENT_ROWS`), and every
:data:`SEGMENT_CHUNKS` files it wrote it writes them again as one chunk of the usual
format (``metrics_log``), then deletes the files that chunk replaces.

Why the history stays the same: the segment is a rows chunk whose ``start_index`` is
the segment's first row, written after every file it replaces, so ``replay`` applies
it last and it holds exactly what they held (merges into its rows included). The
files go only after it is stored, and a reader that finds a listed file gone reads
the listing again (``metrics_log.read_history``). Every write and delete goes through
the storage retry policy.
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import filesystem as fsu, metrics_log

SEGMENT_CHUNKS = 50
"""Files written into the current segment before they are folded into one."""

SEGMENT_ROWS = 10_000
"""Rows of a full segment: once folded with this many, the next segment starts."""


class HistoryWriter:
    """The writer of one run's history (``RunStorage.append_metrics`` / ``merge_metrics``).

    Args:
        fs: The run's filesystem.
        directory: The history's folder (``_lumos/metrics``).
        segment_chunks: See :data:`SEGMENT_CHUNKS`.
        segment_rows: See :data:`SEGMENT_ROWS`.
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        directory: str,
        segment_chunks: int = SEGMENT_CHUNKS,
        segment_rows: int = SEGMENT_ROWS,
    ) -> None:
        if segment_chunks < 2 or segment_rows < 1:
            raise ValueError(
                f"segment_chunks must be >= 2 and segment_rows >= 1, got "
                f"segment_chunks={segment_chunks}, segment_rows={segment_rows}"
            )
        self.fs, self.directory = fs, directory
        self.segment_chunks, self.segment_rows = segment_chunks, segment_rows
        self._start: int | None = None  # history index of self._rows[0]
        self._rows: list[dict[str, Any]] = []
        self._files: list[str] = []  # what the next fold replaces

    def append(self, rows: list[dict[str, Any]], start_index: int) -> None:
        """Store ``rows`` as history rows ``start_index``, ``start_index + 1``, ..."""
        path = metrics_log.write_rows(self.fs, self.directory, rows, start_index)
        if path is None:
            return
        start = self._start
        if start is None or not start <= start_index <= start + len(self._rows):
            # the first write of this process, or a rewind to before the segment
            self._start, self._rows, self._files = start_index, [], []
        else:  # a rewind inside the segment replaces its tail
            del self._rows[start_index - start :]
        self._rows.extend(rows)
        self._files.append(path)
        if len(self._files) >= self.segment_chunks:
            self._fold()

    def merge(self, index: int, metrics: dict[str, Any]) -> None:
        """Merge ``metrics`` into history row ``index`` (a validation's result)."""
        path = metrics_log.write_merge(self.fs, self.directory, index, metrics)
        start = self._start
        if start is not None and start <= index < start + len(self._rows):
            self._rows[index - start] = {**self._rows[index - start], **metrics}
            self._files.append(path)

    def _fold(self) -> None:
        assert self._start is not None
        segment = metrics_log.write_rows(self.fs, self.directory, self._rows, self._start)
        try:
            fsu.call("delete", self.directory, self.fs.rm, self._files)
        except FileNotFoundError:
            pass
        fsu.invalidate(self.fs, self.directory)
        if len(self._rows) >= self.segment_rows:  # full: the next segment starts after it
            self._start, self._rows, self._files = self._start + len(self._rows), [], []
        else:  # the next fold replaces this segment too
            self._files = [] if segment is None else [segment]
