"""A lease under ``_lumos/`` so that two live drivers cannot write the same run."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from fsspec import AbstractFileSystem

from lumos.storage._internal import conditional as cw, filesystem as fsu
from lumos.storage._internal.errors import LeaseHeldError

logger = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
"""The lease document's name under ``_lumos/``."""

LOCK_FILE = ".lease.lock"
"""Local disk: the file flocked to serialise lease updates between processes."""


def _proc_start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), to tell reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _machine_id() -> str:
    """This process's machine: the kernel's boot id and its PID namespace (Linux; else "").

    Two hosts may share a hostname (cloud images, containers); a pid means something
    only where both of these match, so only then is a holder's pid checked here.
    """
    parts = []
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
        parts.append(f.read().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "/".join(parts)


def process_running(pid: int, start_time: str | None = None) -> bool:
    """Whether process ``pid`` runs on this host: it exists and is not a zombie (nor
    dead); with ``start_time`` (its ``/proc`` start time, as the lease records it) a pid
    reused by another process counts as gone too."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[-1].split()[0]
        if state in ("Z", "X"):
            return False
    except OSError:
        pass
    if start_time is not None:
        current = _proc_start_time(pid)
        if current is not None and current != start_time:
            return False
    return True


class Lease:
    """Exclusive right of one driver to write a run; obtained by ``RunStorage.acquire_lease``.

    The lease is a JSON document ``_lumos/lease.json`` with the holder's host,
    pid and an expiry time. It is stale (and can be taken over) once it
    expired because its holder stopped renewing, or at once when the holder
    ran on this host and its process is gone. On local disk check-and-write
    runs under an ``flock`` so it is atomic between processes. On S3 (s3fs) the
    lease is created with a conditional PUT (``If-None-Match: *``) and renewed,
    taken over and deleted only if its ETag is still the one just read
    (``If-Match``), so two drivers can never both hold it. Stores without
    conditional writes (and S3-compatible stores that reject the headers) fall back
    to write-then-read-back, which is best effort.

    Example:
        >>> with storage.acquire_lease(ttl_s=30) as lease:   # doctest: +SKIP
        ...     lease.start_renewing()
        ...     run_training()
    """

    def __init__(
        self,
        fs: AbstractFileSystem,
        path: str,
        run: str,
        holder: str,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self._fs = fs
        self._path = path
        self.run = run
        self.holder = holder
        self.ttl_s = float(ttl_s)
        self.host = socket.gethostname()
        self.machine = _machine_id()
        self.pid = os.getpid()
        self.token = uuid.uuid4().hex
        self._clock = clock
        self._released = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at = clock()  # the lease runs ttl_s from here (acquire, renew)
        self._lost_error: LeaseHeldError | None = None
        # None: unknown yet; False: the store has no conditional writes (fall back).
        self._conditional: bool | None = None if cw.conditional_backend(fs) else False

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """On local disk, serialise lease updates between processes with flock."""
        if not fsu.is_local(self._fs):
            yield
            return
        directory = os.path.dirname(self._path)
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                import fcntl
            except ImportError:  # pragma: no cover - not POSIX
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- document -------------------------------------------------------------
    def _doc(self) -> dict[str, Any]:
        now = self._clock()
        return {
            "holder": self.holder,
            "host": self.host,
            "machine": self.machine,
            "pid": self.pid,
            "pid_start": _proc_start_time(self.pid),
            "token": self.token,
            "acquired_at": now,
            "expires_at": now + self.ttl_s,
            "ttl_s": self.ttl_s,
        }

    def _read(self) -> dict[str, Any] | None:
        return _parse(fsu.read_bytes(self._fs, self._path))

    def _read_versioned(self) -> tuple[bool, dict[str, Any] | None, str | None]:
        """``(exists, document or None when unreadable, etag)``."""
        data, etag = cw.read_with_etag(self._fs, self._path)
        return data is not None, _parse(data), etag

    def _is_live(self, doc: dict[str, Any]) -> bool:
        if float(doc.get("expires_at", 0.0)) <= self._clock():
            return False
        # The holder's pid is checked only on its own machine: another host with the same
        # hostname would find the pid dead (or someone else's) and take a live lease.
        # (A document without "machine", from an older lumos: the hostname decides.)
        if doc.get("host") == self.host and doc.get("machine", self.machine) == self.machine:
            return process_running(int(doc.get("pid", -1)), doc.get("pid_start"))
        return True

    def _error(self, doc: dict[str, Any], detail: str = "") -> LeaseHeldError:
        return LeaseHeldError(
            run=self.run,
            holder=str(doc.get("holder", "?")),
            host=str(doc.get("host", "?")),
            pid=int(doc.get("pid", -1)),
            expires_in_s=float(doc.get("expires_at", 0.0)) - self._clock(),
            detail=detail,
        )

    def _acquire(self) -> None:
        if self._conditional is not False:
            try:
                self._acquire_conditional()
                self._conditional = True
                return
            except cw.ConditionalWritesUnsupportedError as exc:
                logger.info("No conditional writes on %s (%s); lease is best effort", self.run, exc)
                self._conditional = False
        with self._exclusive():
            current = self._read()
            if (
                current is not None
                and current.get("token") != self.token
                and self._is_live(current)
            ):
                raise self._error(current)
            fsu.atomic_write_bytes(self._fs, self._path, json.dumps(self._doc()).encode())
            back = self._read()
        if back is None or back.get("token") != self.token:
            other = back or {}
            raise self._error(
                other,
                f"Run {self.run!r}: another driver acquired the lease at the same time "
                f"(holder={other.get('holder', '?')!r}, host={other.get('host', '?')!r}, "
                f"pid={other.get('pid', '?')}). Only one driver may write a run.",
            )

    def _acquire_conditional(self) -> None:
        """Create the lease (If-None-Match) or take a stale one over (If-Match on its ETag)."""
        for _ in range(5):
            exists, current, etag = self._read_versioned()
            payload = json.dumps(self._doc()).encode()
            if not exists:
                # True: created. False: someone created it meanwhile, or our own retried
                # put landed. Either way the read-back decides (it also catches an
                # S3-compatible store that ignores the header).
                cw.put_if_absent(self._fs, self._path, payload)
                back = self._read()
                if back is not None and back.get("token") == self.token:
                    return
                continue
            if (
                current is not None
                and current.get("token") != self.token
                and self._is_live(current)
            ):
                raise self._error(current)
            if etag is None:
                raise cw.ConditionalWritesUnsupportedError("the store returned no ETag")
            cw.put_if_match(self._fs, self._path, payload, etag)
            back = self._read()
            if back is not None and back.get("token") == self.token:
                return  # ours (a retried put whose first try landed included)
        other = self._read() or {}
        raise self._error(
            other,
            f"Run {self.run!r}: another driver acquired the lease at the same time "
            f"(holder={other.get('holder', '?')!r}, host={other.get('host', '?')!r}, "
            f"pid={other.get('pid', '?')}). Only one driver may write a run.",
        )

    def _lost(self, current: dict[str, Any]) -> LeaseHeldError:
        return self._error(
            current,
            f"Lost the lease of run {self.run!r}: it expired and was taken over by "
            f"holder={current.get('holder')!r} (host={current.get('host')!r}, "
            f"pid={current.get('pid')}). Renew more often than ttl_s={self.ttl_s}.",
        )

    def _renew_conditional(self) -> None:
        exists, current, etag = self._read_versioned()
        if exists and current is not None and current.get("token") != self.token:
            raise self._lost(current)
        payload = json.dumps(self._doc()).encode()
        if not exists:
            ok = cw.put_if_absent(self._fs, self._path, payload)
        elif etag is None:
            raise cw.ConditionalWritesUnsupportedError("the store returned no ETag")
        else:
            ok = cw.put_if_match(self._fs, self._path, payload, etag)
        if not ok:
            back = self._read()
            if back is None or back.get("token") != self.token:
                raise self._lost(back or {})

    # -- public ---------------------------------------------------------------
    @property
    def released(self) -> bool:
        """Whether ``release()`` was called."""
        return self._released

    def renew(self) -> None:
        """Extend the lease by ``ttl_s`` from now.

        Raises:
            LeaseHeldError: Another driver took the lease over (ours had expired).
        """
        with self._lock, self._exclusive():
            if self._released:
                raise RuntimeError(f"lease of run {self.run!r} was already released")
            try:
                if self._conditional:
                    self._renew_conditional()
                else:
                    current = self._read()
                    if current is not None and current.get("token") != self.token:
                        raise self._lost(current)
                    payload = json.dumps(self._doc()).encode()
                    fsu.atomic_write_bytes(self._fs, self._path, payload)
            except LeaseHeldError as exc:
                self._lost_error = exc
                raise
            self._renewed_at = self._clock()

    def ensure_held(self) -> None:
        """Fence a write of the run: raise unless this lease is still ours.

        A driver that was stopped (SIGSTOP, a VM pause, a late renewal) for longer than
        ``ttl_s`` may have been taken over; it must not write the run again. A lease
        whose last renewal is older than 0.8 ``ttl_s`` (close to expiring, or expired)
        is renewed here first, which fails when another driver holds it now. A
        released lease fences nothing.

        Raises:
            LeaseHeldError: The lease was lost: another driver owns the run.
        """
        if self._released:
            return
        if self._lost_error is None and self._clock() - self._renewed_at > self.ttl_s * 0.8:
            try:
                self.renew()
            except LeaseHeldError:
                pass  # recorded as lost below
        if self._lost_error is not None:
            raise self._error(
                {},
                f"this driver lost the lease of run {self.run!r} and writes nothing more "
                f"to it ({self._lost_error}); the driver that holds it now owns the run",
            )

    def start_renewing(self, interval_s: float | None = None) -> None:
        """Renew in a daemon thread every ``interval_s`` (default ``ttl_s / 3``) until released."""
        if self._thread is not None:
            return
        interval = self.ttl_s / 3 if interval_s is None else interval_s

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.renew()
                except Exception as exc:
                    if not self._stop.is_set():
                        logger.warning("Stopped renewing the lease of run %r: %s", self.run, exc)
                    return

        self._thread = threading.Thread(target=loop, name=f"lumos-lease-{self.run}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Give the lease up (deletes the lease file if it is still ours). Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(self.ttl_s, 5.0))
        with self._lock, self._exclusive():
            if self._released:
                return
            self._released = True
            if self._conditional:
                _, current, etag = self._read_versioned()
                if current is not None and current.get("token") == self.token and etag:
                    try:
                        cw.delete_if_match(self._fs, self._path, etag)
                        return
                    except cw.ConditionalWritesUnsupportedError:
                        pass  # no conditional delete: a plain one below
            current = self._read()
            if current is not None and current.get("token") == self.token:
                try:
                    fsu.call("delete", self._path, self._fs.rm_file, self._path)
                except FileNotFoundError:
                    pass
                fsu.invalidate(self._fs, self._path)

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease(run={self.run!r}, holder={self.holder!r}, ttl_s={self.ttl_s})"


def _parse(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None  # a torn or foreign file does not protect anything
    return doc if isinstance(doc, dict) else None
