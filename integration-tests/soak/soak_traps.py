"""What the soak's new faults need from the machine: a small disk that fills up, a trap on
the run state's write (local disk: inotify; S3: moto's ``put_object`` in this process),
and the multipart uploads moto has in progress.

None of this touches lumos: the disk is a real tmpfs (the drivers get ENOSPC from the
kernel), the local trap watches the files the driver writes, and the S3 trap sits in
the S3 server the harness runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import shutil
import struct
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- a small disk -------------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path`` (root only); ``fill`` takes all its free space."""

    FILLER = ".soak-filler"

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size
        self.mounted = False

    @classmethod
    def mount(cls, path: Path, size: str) -> SmallDisk | None:
        """Mount a tmpfs at ``path``; None when this machine does not let us (not root...)."""
        path.mkdir(parents=True, exist_ok=True)
        disk = cls(path, size)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            return None
        disk.mounted = True
        return disk

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Write a filler file until the kernel says ENOSPC; returns its size."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(self.path / self.FILLER, "wb", buffering=0) as f:
            for size in (1 << 20, 4096, 1):
                piece = chunk[:size]
                while True:
                    try:
                        n = f.write(piece)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    written += n or 0
        return written

    def free(self) -> None:
        """Remove the filler (the space comes back)."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / self.FILLER).unlink()

    def unmount_keeping_files(self) -> None:
        """Copy the files out, unmount, and put them back where they were (the soak's state)."""
        if not self.mounted:
            return
        self.free()
        saved = self.path.with_name(self.path.name + ".saved")
        with contextlib.suppress(OSError):
            shutil.copytree(self.path, saved, symlinks=True, dirs_exist_ok=True)
        proc = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.mounted = False
        if saved.exists():
            with contextlib.suppress(OSError):
                self.path.rmdir()
                saved.rename(self.path)


# -- the local state write: inotify -------------------------------------------------------------

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
_EVENT = struct.Struct("iIII")


class InotifyTrap:
    """Calls ``hit(name, data)`` from a thread the moment a file in ``directory`` is written.

    ``hit`` gets each written file's name and its bytes so far and returns True when
    it did what it wanted (the trap then stops).
    """

    def __init__(self, directory: Path, hit: Callable[[str, bytes], bool]) -> None:
        self.directory = directory
        self.hit = hit
        self.done = threading.Event()
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
        wd = self._libc.inotify_add_watch(self._fd, str(directory).encode(), mask)
        if wd < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
        self._thread = threading.Thread(target=self._loop, name="soak-inotify", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self.done.is_set():
                ready, _, _ = select.select([self._fd], [], [], 0.2)
                if not ready:
                    continue
                try:
                    buf = os.read(self._fd, 65536)
                except BlockingIOError:
                    continue
                for name in _names(buf):
                    try:
                        data = (self.directory / name).read_bytes()
                    except OSError:
                        continue
                    if self.hit(name, data):
                        self.done.set()
                        return
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def stop(self) -> None:
        self.done.set()


def _names(buf: bytes) -> list[str]:
    names, i = [], 0
    while i + _EVENT.size <= len(buf):
        _wd, _mask, _cookie, length = _EVENT.unpack_from(buf, i)
        raw = buf[i + _EVENT.size : i + _EVENT.size + length]
        i += _EVENT.size + length
        name = raw.rstrip(b"\0").decode(errors="replace")
        if name and name not in names:
            names.append(name)
    return names


# -- the S3 server: a hook on moto's put_object, and its multipart uploads ----------------------

_PUT_TRAPS: dict[str, Callable[[bytes | None], str | None]] = {}
_PUT_LOCK = threading.Lock()
_PATCHED = False


class DroppedWrite(Exception):
    """Raised inside moto when a trap drops the write (the client is dead by then)."""


def install_put_hook() -> None:
    """Patch moto's ``S3Backend.put_object`` (this process's S3 server) to call the traps."""
    global _PATCHED
    if _PATCHED:
        return
    from moto.s3.models import S3Backend

    original = S3Backend.put_object

    def put_object(
        self: Any, bucket_name: str, key_name: str, value: bytes, *a: Any, **kw: Any
    ) -> Any:
        with _PUT_LOCK:
            trap = _PUT_TRAPS.get(f"{bucket_name}/{key_name}")
        verdict = None if trap is None else trap(value)
        if verdict is not None:
            with _PUT_LOCK:
                _PUT_TRAPS.pop(f"{bucket_name}/{key_name}", None)
        if verdict == "drop":
            raise DroppedWrite(key_name)
        stored = original(self, bucket_name, key_name, value, *a, **kw)
        if verdict == "land":
            trap(None)  # type: ignore[misc]  # stored now
        return stored

    S3Backend.put_object = put_object  # type: ignore[method-assign]
    _PATCHED = True


def set_put_trap(key: str, trap: Callable[[bytes | None], str | None] | None) -> None:
    """``trap(body)`` runs on every PUT of ``bucket/key``: ``None`` lets it through and keeps
    the trap, ``"land"`` lets it through and removes the trap (then ``trap(None)`` once it
    is stored), ``"drop"`` drops it."""
    with _PUT_LOCK:
        if trap is None:
            _PUT_TRAPS.pop(key, None)
        else:
            _PUT_TRAPS[key] = trap


def multipart_uploads(bucket: str) -> list[tuple[str, str, int]]:
    """``(key, upload id, parts received)`` of every multipart upload moto has in progress."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    found = backend.buckets.get(bucket)
    if found is None:
        return []
    for _ in range(5):  # the server's threads change the dict while we read it
        try:
            return [(m.key_name, m.id, len(m.partlist)) for m in list(found.multiparts.values())]
        except RuntimeError:
            continue
    return []
