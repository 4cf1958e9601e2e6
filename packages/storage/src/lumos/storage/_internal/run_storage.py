"""RunStorage: the layout of one run on any fsspec filesystem."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import conditional as cw, filesystem as fsu, metrics_log
from lumos.storage._internal.checkpoint import Checkpoint
from lumos.storage._internal.checkpoint_log import with_dropped
from lumos.storage._internal.errors import StorageUsageError
from lumos.storage._internal.lease import LEASE_FILE, Lease
from lumos.storage._internal.metrics_segments import HistoryWriter
from lumos.storage._internal.names import validate_name, validate_relpath
from lumos.storage._internal.retention import RetentionPolicy
from lumos.storage._internal.retried import retried_child_dirs
from lumos.storage._internal.run_index import RunIndexWriter, index_folder
from lumos.storage._internal.state import CheckpointRecord, RunState, decode_state, encode_state

STATE_DIR = "_lumos"
"""The run's own directory of lumos state, next to its checkpoints."""

STATE_FILE = "run_state.json"
"""The run state document's name under ``_lumos/``."""


class RunStorage:
    """Where one run (a Train run or a Tune experiment) keeps its files.

    Layout::

        {storage_path}/{name}/
          _lumos/run_state.json     RunState, written atomically
          _lumos/lease.json         the live driver's lease
          _lumos/metrics/*.json     report history, immutable chunks
          <checkpoint_dir_name>/    committed checkpoints

    A checkpoint directory counts only once a RunState naming it has been
    written; anything else is an unfinished upload (``list_uncommitted``).

    Args:
        storage_path: Local path (``~`` expanded) or fsspec URL of the parent directory.
        name: The run's name; a single safe path component.
        filesystem: Explicit fsspec filesystem (``storage_path`` then in its form).

    Attributes:
        fs: The fsspec filesystem.
        storage_path: ``storage_path`` in the filesystem's own form.
        name: The run's name.
        run_path: ``{storage_path}/{name}``.
        state_dir: ``{run_path}/_lumos``.
        max_workers: Upload/download threads (default 16; local copies use at most 4).

    Raises:
        InvalidNameError: ``name`` is not a valid name.

    Example:
        >>> storage = RunStorage("memory://runs", "run-42")
        >>> storage.load_state() is None
        True
    """

    def __init__(
        self,
        storage_path: str | os.PathLike[str],
        name: str,
        filesystem: AbstractFileSystem | None = None,
    ) -> None:
        self.name = validate_name(name, "name")
        self.fs, self.storage_path = fsu.resolve_filesystem(storage_path, filesystem)
        self.run_path = fsu.join(self.storage_path, self.name)
        self.state_dir = fsu.join(self.run_path, STATE_DIR)
        self.max_workers = fsu.DEFAULT_MAX_WORKERS
        self._lease: Lease | None = None  # held by this process: fences its writes
        self._index = RunIndexWriter(self.fs, self.storage_path, self.name)  # run_index.py
        self._history = HistoryWriter(self.fs, self._metrics_dir)

    # -- paths ----------------------------------------------------------------
    @property
    def uri(self) -> str:
        """A URL of the run directory for another process (``s3://b/runs/name`` or a local path)."""
        return fsu.to_uri(self.fs, self.run_path)

    @property
    def state_path(self) -> str:
        """Path of the run state document."""
        return fsu.join(self.state_dir, STATE_FILE)

    def checkpoint_path(self, dir_name: str) -> str:
        """Path of checkpoint ``dir_name`` in this run (validates the name)."""
        return fsu.join(self.run_path, validate_name(dir_name, "checkpoint_dir_name"))

    def checkpoint(self, dir_name: str) -> Checkpoint:
        """A Checkpoint for directory ``dir_name`` of this run."""
        return Checkpoint(self.checkpoint_path(dir_name), self.fs)

    def child(self, name: str) -> RunStorage:
        """A run nested in this run's directory (a Tune trial, a Train run under a trial)."""
        return RunStorage(self.run_path, name, self.fs)

    def exists(self) -> bool:
        """Whether the run has a state document."""
        fsu.invalidate(self.fs, self.state_dir)
        return bool(fsu.call("list", self.state_path, self.fs.exists, self.state_path))

    # -- checkpoints ----------------------------------------------------------
    def persist_directory(
        self,
        local_dir: str | os.PathLike[str],
        dir_name: str,
        *,
        on_file_done: Callable[[str], None] | None = None,
        move_files: bool = False,
    ) -> Checkpoint:
        """Upload every file of a local directory into ``run_path/dir_name/`` concurrently.

        Several ranks may persist into the same ``dir_name``; their files merge
        (sharded checkpoints). The checkpoint is not committed until
        ``commit_checkpoint`` writes a state naming it. Either way the files are
        durable (fsynced, with their folders) when this returns.

        Args:
            local_dir: The local directory to upload.
            dir_name: Checkpoint directory name inside the run.
            on_file_done: Called with each relative path once it is stored
                (from the upload threads).
            move_files: The caller deletes ``local_dir`` afterwards and never rewrites
                its files: on local storage on the same filesystem each file is
                hard-linked into the run instead of copied (no second copy, no second
                write to disk); elsewhere they are copied as without it.

        Returns:
            The (uncommitted) checkpoint in storage.
        """
        dest = self.checkpoint_path(dir_name)
        src = os.path.abspath(os.path.expanduser(os.fspath(local_dir)))
        if not os.path.isdir(src):
            raise FileNotFoundError(f"persist_directory: {src!r} is not a directory")
        fsu.upload_dir(src, self.fs, dest, self.max_workers, on_file_done, link=move_files)
        return Checkpoint(dest, self.fs)

    def list_checkpoints(self) -> list[Checkpoint]:
        """The committed checkpoints, oldest first."""
        state = self.load_state()
        return [] if state is None else [self.checkpoint(n) for n in state.checkpoint_names()]

    # -- state ----------------------------------------------------------------
    def load_state(self) -> RunState | None:
        """Read the run state, or None when the run has none yet.

        Raises:
            RunStateError: The document is corrupt, invalid or from a newer schema.
        """
        fsu.invalidate(self.fs, self.state_dir)
        data = fsu.read_bytes(self.fs, self.state_path)
        return None if data is None else decode_state(data, self.state_path)

    def save_state(self, state: RunState) -> None:
        """Write the run state atomically (tmp + fsync + rename locally; one put on object
        stores), then the run's record in the storage path's index (``run_index``)."""
        self._fence()
        if state.name != self.name:
            raise StorageUsageError(
                f"state.name={state.name!r} does not match the run name {self.name!r}"
            )
        fsu.atomic_write_bytes(self.fs, self.state_path, encode_state(state))
        self._index.state_saved(state)

    def commit_checkpoint(
        self,
        state: RunState,
        record: CheckpointRecord,
        retention: RetentionPolicy | None = None,
        *,
        delete_dropped: bool = True,
    ) -> tuple[RunState, list[str]]:
        """Commit a persisted checkpoint: write the state naming it, then apply retention.

        The record is appended (replacing a record of the same directory) and
        becomes the latest; ``retention`` picks checkpoints to drop (never the
        latest); the new state is written atomically; only THEN are the dropped
        directories deleted, so a crash at any point leaves a consistent run.
        ``report_count`` becomes at least ``record.report_index + 1``.

        Args:
            state: The run's current state.
            record: The persisted checkpoint to commit.
            retention: Which committed checkpoints to keep.
            delete_dropped: ``False`` returns the dropped directories without
                deleting them, for a caller that has something more urgent to do
                first (a driver acknowledging its workers); it deletes them later
                with :meth:`delete_checkpoints`. Until then they are directories no
                state names, which a restore removes like any unfinished upload.

        Returns:
            ``(new_state, dropped_dir_names)``: deleted already unless
            ``delete_dropped=False``.
        """
        self.checkpoint_path(record.dir_name)
        records = [r for r in state.checkpoints if r.dir_name != record.dir_name] + [record]
        state = state.model_copy(
            update={"report_count": max(state.report_count, record.report_index + 1)}
        )
        return self.update_checkpoints(
            state, records, record.dir_name, retention, delete_dropped=delete_dropped
        )

    def update_checkpoints(
        self,
        state: RunState,
        records: list[CheckpointRecord],
        latest: str | None,
        retention: RetentionPolicy | None = None,
        *,
        delete_dropped: bool = True,
        **update: Any,
    ) -> tuple[RunState, list[str]]:
        """Replace the committed checkpoint records, then apply retention.

        For changes other than a new commit: a validation's result merged into a
        record, checkpoints marked rolled back. Same order as :meth:`commit_checkpoint`:
        the new state (naming ``records`` minus what ``retention`` drops, with ``latest``
        as the latest checkpoint) is written first, the dropped directories deleted after.

        Args:
            state: The run's current state.
            records: The new list of committed checkpoints, oldest first.
            latest: The latest checkpoint's directory name (never dropped), or ``None``.
            retention: Which committed checkpoints to keep.
            delete_dropped: See :meth:`commit_checkpoint`.
            **update: Other fields of the new state (e.g. ``rollbacks``).

        Returns:
            ``(new_state, dropped_dir_names)``.
        """
        dropped = retention.select_to_delete(records, latest) if retention else []
        dropped_names = {r.dir_name for r in dropped}
        new_state = state.model_copy(
            update={
                "checkpoints": [r for r in records if r.dir_name not in dropped_names],
                "latest_checkpoint": latest,
                "deleted_checkpoints": with_dropped(state.deleted_checkpoints, dropped),
                "updated_at": time.time(),
                **update,
            }
        )
        self.save_state(new_state)
        names = [r.dir_name for r in dropped]
        if delete_dropped:
            self.delete_checkpoints(names)
        return new_state, names

    def rename_checkpoint(self, dir_name: str, new_name: str) -> None:
        """Move checkpoint directory ``dir_name`` to ``new_name`` (missing: nothing to do).

        A local move is one ``rename``; object stores copy then delete, so this costs
        the checkpoint's size there.
        """
        self._fence()
        src, dst = self.checkpoint_path(dir_name), self.checkpoint_path(new_name)
        fsu.invalidate(self.fs, src)
        if not fsu.call("list", src, self.fs.exists, src):
            return
        if fsu.is_local(self.fs):
            fsu.call("rename", src, os.replace, src, dst)
        else:  # file by file: object stores have no directories to move
            # Each copy is idempotent, and the source goes only after every copy
            # landed, so a retry (or a rerun after a failure) completes the move.
            base = self.fs._strip_protocol(src).rstrip("/")
            for path in fsu.call("list", src, self.fs.find, src):
                rel = str(path)[len(base) :].lstrip("/")
                fsu.call("rename", str(path), self.fs.copy, path, fsu.join(dst, rel))
            self._rm_dir(src)
        fsu.invalidate(self.fs, src)
        fsu.invalidate(self.fs, dst)

    def delete_checkpoints(self, dir_names: Iterable[str]) -> None:
        """Delete checkpoint directories that the saved state no longer names.

        Args:
            dir_names: Names returned by ``commit_checkpoint(..., delete_dropped=False)``.
        """
        self._fence()
        for name in dir_names:
            self._rm_dir(self.checkpoint_path(name))

    def _rm_dir(self, path: str) -> None:
        try:
            fsu.call("delete", path, self.fs.rm, path, recursive=True)
        except FileNotFoundError:
            pass
        fsu.invalidate(self.fs, path)

    def list_uncommitted(self, reserved: Iterable[str] = ()) -> list[str]:
        """Top-level directories of the run that are neither ``_lumos``, committed, nor reserved.

        Args:
            reserved: Directory names owned by someone else (Tune trial
                directories, nested runs) that must not count.
        """
        state = self.load_state()
        keep = {STATE_DIR, *reserved, *(state.checkpoint_names() if state else ())}
        return [n for n in retried_child_dirs(self.fs, self.run_path) if n not in keep]

    def delete_uncommitted(self, reserved: Iterable[str] = ()) -> list[str]:
        """Delete unfinished uploads (see ``list_uncommitted``) and return their names.

        Also aborts S3 multipart uploads left in progress under the run, and removes
        what interrupted local writes left (:meth:`remove_interrupted_writes`).
        """
        self._fence()
        names = self.list_uncommitted(reserved)
        for name in names:
            self._rm_dir(fsu.join(self.run_path, name))
        cw.abort_multipart_uploads(self.fs, self.run_path)  # cut off by a killed writer
        self.remove_interrupted_writes()
        return names

    def remove_interrupted_writes(self) -> None:
        """Remove the temporary files that local atomic writes killed mid-write left in
        ``_lumos/`` (the state, the lease, any record) and in the run's index record.

        Local disk only (an object store's write is one PUT). Call it holding the run's
        lease: ``lumos.runtime``'s run claim does, for Train runs and Tune sweeps alike.
        """
        self._fence()
        if fsu.is_local(self.fs):
            fsu.remove_temp_files(self.state_dir)
            fsu.remove_temp_files(index_folder(self.storage_path, self.name))

    # -- json and metrics -----------------------------------------------------
    @property
    def _metrics_dir(self) -> str:
        return fsu.join(self.state_dir, metrics_log.METRICS_DIR)

    def read_json(self, relpath: str) -> Any | None:
        """Read ``_lumos/<relpath>`` as JSON, or None when it does not exist."""
        validate_relpath(relpath)
        data = fsu.read_bytes(self.fs, fsu.join(self.state_dir, relpath))
        return None if data is None else json.loads(data)

    def write_json(self, relpath: str, obj: Any) -> None:
        """Write ``obj`` as JSON to ``_lumos/<relpath>`` atomically."""
        validate_relpath(relpath)
        fsu.atomic_write_bytes(self.fs, fsu.join(self.state_dir, relpath), json.dumps(obj).encode())

    def append_metrics(self, rows: list[dict[str, Any]], start_index: int) -> None:
        """Store ``rows`` (reports ``start_index``, ``start_index + 1``, ...) as a new chunk.

        Chunks are files under ``_lumos/metrics/``; every 50 of them are folded into one
        (``metrics_segments``), which holds the same rows. Chunks apply in the order they were written; a chunk whose
        ``start_index`` lies inside the history (a run resumed from an earlier
        checkpoint) replaces the rows from there on.
        """
        self._fence()
        self._history.append(rows, start_index)
        self._index.rows_appended(rows, start_index)

    def merge_metrics(self, index: int, metrics: dict[str, Any]) -> None:
        """Merge ``metrics`` into report ``index``'s row of the history (a new chunk).

        Used for results that arrive after the report, such as a checkpoint's
        validation. A later chunk that rewrites the history from ``index`` or earlier
        (a resumed run reporting again) supersedes the merge.
        """
        self._fence()
        self._history.merge(index, metrics)

    def read_metrics(self) -> list[dict[str, Any]]:
        """The full report history in order (see ``append_metrics``)."""
        return metrics_log.read_history(self.fs, self._metrics_dir)

    # -- lease ----------------------------------------------------------------
    def acquire_lease(
        self,
        holder: str | None = None,
        ttl_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> Lease:
        """Take the run's lease, so no other live driver writes this run.

        Args:
            holder: A label for the holder (default ``host:pid``).
            ttl_s: Seconds the lease stays valid without ``renew()``.
            clock: Wall clock (tests inject one).

        Raises:
            LeaseHeldError: A live holder has the lease (the message names the
                run and the holder's host and pid).
        """
        lease = Lease(
            self.fs,
            fsu.join(self.state_dir, LEASE_FILE),
            run=self.uri,
            holder=holder or f"{socket.gethostname()}:{os.getpid()}",
            ttl_s=ttl_s,
            clock=clock,
        )
        lease._acquire()
        self._lease = lease
        return lease

    def _fence(self) -> None:
        """Refuse to write the run once this process lost its lease (see ``Lease.ensure_held``)."""
        if self._lease is not None:
            self._lease.ensure_held()

    @contextlib.contextmanager
    def leased(self, holder: str | None = None) -> Iterator[Lease]:
        """Hold the run's lease, renewed in the background, for the ``with`` block.

        The skeleton every driver (a Train ``fit()``, a Tune ``fit()``) runs under:
        take the lease, keep it alive while working, always release it.

        Args:
            holder: A label for the holder (default ``host:pid``).

        Raises:
            LeaseHeldError: A live holder has the lease.

        Example:
            >>> with RunStorage("memory://runs", "run-42").leased("my driver") as lease:
            ...     lease.released
            False
        """
        lease = self.acquire_lease(holder)
        lease.start_renewing()
        try:
            yield lease
        finally:
            lease.release()

    def __repr__(self) -> str:
        return f"RunStorage(uri={self.uri!r})"

    def __getstate__(self) -> dict[str, Any]:  # a lease and the segment being filled stay
        return {**self.__dict__, "_lease": None, "_history": HistoryWriter(self.fs, self._metrics_dir)}  # fmt: skip
