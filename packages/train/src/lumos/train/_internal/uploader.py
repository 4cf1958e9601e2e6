"""Worker side of ASYNC checkpoint uploads: snapshot, background upload, back-pressure.

``train.report(..., checkpoint_upload_mode=ASYNC)`` hands the checkpoint over here and
returns. One background thread per worker uploads the checkpoints in report order
(``RunStorage.persist_directory``, itself concurrent per file, or the user's
``checkpoint_upload_fn``) and tells the driver when each one finished; the driver
commits a report once every rank's upload of it finished.

* **Bounded.** At most :data:`MAX_UPLOADS_IN_FLIGHT` checkpoints per worker are handed
  over and not yet uploaded (one uploading, one waiting); the next ``report()`` waits
  for a slot (back-pressure) instead of queueing snapshots without limit.
* **Snapshot.** Before ``report()`` returns, the user's directory is hard-linked file by
  file into a lumos-owned directory on the same filesystem (a copy only where linking
  fails), so a ``tempfile.TemporaryDirectory`` left right after ``report()`` is safe and
  the snapshot costs no disk space. Files must not be rewritten in place meanwhile
  (write each checkpoint into a new directory).
* **Failure.** An upload error is sent to the driver, which fails this rank like a user
  error: the run restarts from its last committed checkpoint.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lumos.train._internal.errors import CheckpointReportError

if TYPE_CHECKING:
    from lumos.storage import Checkpoint

MAX_UPLOADS_IN_FLIGHT = 2
"""Checkpoints per worker handed to the uploader and not yet uploaded (one uploading,
one waiting); ``report()`` waits for a slot beyond that."""

SNAPSHOT_PREFIX = ".lumos-snapshot-"

MKDTEMP_HINT = (
    "with checkpoint_upload_mode=ASYNC, write each checkpoint into a directory that "
    "outlives report(), e.g. d = tempfile.mkdtemp() (it is deleted after its upload by "
    "default), not a `with tempfile.TemporaryDirectory()` block that ends before the upload"
)


@dataclass
class UploadJob:
    """One checkpoint to upload in the background.

    Attributes:
        index: The report's index.
        dir_name: The checkpoint's directory name in the run.
        upload: Does the upload (raises on failure).
        cleanup: Local directories to delete once the upload ended (the snapshot, and
            the user's directory when ``delete_local_checkpoint_after_upload``).
    """

    index: int
    dir_name: str
    upload: Callable[[], None]
    cleanup: list[str] = field(default_factory=list)


def snapshot_directory(src: str) -> str:
    """Hard-link every file of ``src`` into a new lumos-owned directory; return its path.

    The snapshot sits next to ``src`` (same filesystem, so ``os.link`` works); a file
    that cannot be linked is copied.

    Raises:
        CheckpointReportError: ``src`` is not a directory (any more).
    """
    if not os.path.isdir(src):
        raise CheckpointReportError(
            f"the checkpoint directory {src!r} does not exist (any more); {MKDTEMP_HINT}"
        )
    parent = os.path.dirname(os.path.abspath(src))
    dest = os.path.join(parent, f"{SNAPSHOT_PREFIX}{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(dest)
    except OSError:  # parent not writable: a temp dir (links may then cross filesystems)
        import tempfile

        dest = tempfile.mkdtemp(prefix=SNAPSHOT_PREFIX)
    try:
        for root, dirs, files in os.walk(src):
            rel = os.path.relpath(root, src)
            target = dest if rel == "." else os.path.join(dest, rel)
            for d in dirs:
                os.makedirs(os.path.join(target, d), exist_ok=True)
            for name in files:
                a, b = os.path.join(root, name), os.path.join(target, name)
                try:
                    os.link(a, b)
                except OSError:
                    shutil.copy2(a, b)
    except FileNotFoundError as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise CheckpointReportError(
            f"a file of the checkpoint directory {src!r} vanished while report() took its "
            f"snapshot ({exc.filename}); {MKDTEMP_HINT}"
        ) from exc
    return dest


class Uploader:
    """One worker's background uploads (see the module docstring).

    Args:
        on_done: Called from the upload thread with ``(job, error or None)`` after each
            upload; the session turns it into a message to the driver.
        stop_requested: True once the driver asked this worker to stop (a waiting
            ``acquire`` then raises ``StopRequested``).
        in_thread: Called in the upload thread around its work (makes the training
            session current there, so ``checkpoint_upload_fn`` may call ``train.*``).

    Example:
        >>> up = Uploader(lambda job, err: print(job.dir_name, err), lambda: False)
        >>> up.acquire()
        >>> up.submit(UploadJob(0, "ckpt", upload=lambda: None))
        >>> up.wait_idle()
        ckpt None
        True
    """

    def __init__(
        self,
        on_done: Callable[[UploadJob, BaseException | None], None],
        stop_requested: Callable[[], bool],
        in_thread: Callable[[bool], None] | None = None,
    ) -> None:
        self._on_done = on_done
        self._in_thread = in_thread
        self._stop_requested = stop_requested
        self._cond = threading.Condition()
        self._in_flight = 0
        self._jobs: queue.SimpleQueue[UploadJob | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` cancelled the remaining uploads."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Checkpoints handed over (or reserved) and not uploaded yet."""
        with self._cond:
            return self._in_flight

    def acquire(self) -> None:
        """Reserve a slot, waiting while :data:`MAX_UPLOADS_IN_FLIGHT` uploads are in flight.

        Raises:
            StopRequested: the driver asked this worker to stop while it waited.
        """
        with self._cond:
            while self._in_flight >= MAX_UPLOADS_IN_FLIGHT:
                if self._stop_requested():
                    from lumos.runtime import StopRequested

                    raise StopRequested("the owner requested a stop")
                self._cond.wait(0.1)  # also re-checks the stop flag
            self._in_flight += 1

    def release(self) -> None:
        """Give back a slot reserved by :meth:`acquire` without submitting a job."""
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def submit(self, job: UploadJob) -> None:
        """Queue ``job`` (after :meth:`acquire`) for the upload thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="lumos-checkpoint-upload", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted upload ended; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout_s)

    def close(self, cancel: bool) -> None:
        """End the upload thread after the queued jobs (``cancel``: skip them)."""
        self._closed = cancel
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        if self._in_thread is not None:
            self._in_thread(True)
        try:
            self._loop()
        finally:
            if self._in_thread is not None:
                self._in_thread(False)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            error: BaseException | None = None
            try:
                if self._closed:
                    raise CheckpointReportError(
                        f"upload of {job.dir_name!r} cancelled: the training function ended"
                    )
                job.upload()
            except BaseException as exc:
                error = exc
            finally:
                for path in job.cleanup:
                    shutil.rmtree(path, ignore_errors=True)
            try:
                if not self._closed:
                    self._on_done(job, error)
            finally:
                self.release()


def persist_job_upload(
    storage: Any,
    local_dir: str,
    dir_name: str,
    cancelled: Callable[[], bool],
    move_files: bool = False,
) -> Callable[[], None]:
    """An upload that copies ``local_dir`` into the run's ``dir_name`` (stops once ``cancelled``).

    ``move_files``: ``local_dir`` is deleted after the upload and nothing rewrites its
    files, so on local storage they are hard-linked into the run instead of copied
    (``RunStorage.persist_directory(move_files=True)``).
    """

    def upload() -> None:
        def on_file_done(_rel: str) -> None:
            if cancelled():
                raise CheckpointReportError(f"upload of {dir_name!r} cancelled")

        if not os.path.isdir(local_dir):
            raise CheckpointReportError(
                f"the checkpoint directory {local_dir!r} vanished before its upload; "
                + MKDTEMP_HINT
            )
        storage.persist_directory(
            local_dir, dir_name, on_file_done=on_file_done, move_files=move_files
        )

    return upload


def user_fn_upload(
    fn: Callable[[Checkpoint, str], Checkpoint],
    checkpoint: Checkpoint,
    dir_name: str,
    check: Callable[[Any, str], None],
) -> Callable[[], None]:
    """An upload through the user's ``checkpoint_upload_fn``; ``check`` verifies its result."""

    def upload() -> None:
        check(fn(checkpoint, dir_name), dir_name)

    return upload
