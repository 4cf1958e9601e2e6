"""Helpers shared by the storage tests (not a test module)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

CHILD = str(Path(__file__).with_name("crash_child.py"))


class Child:
    def __init__(self, mode: str, storage_path: str, name: str, endpoint: str = "") -> None:
        args = [sys.executable, CHILD, mode, storage_path, name]
        if endpoint:
            args.append(endpoint)
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def wait_for(self, prefix: str) -> str:
        """Read lines until one starts with ``prefix`` (blocking reads; bounded by the test timeout)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line.strip()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(f"child exited (rc={self.proc.wait()}) before {prefix!r}: {err}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=60) == -signal.SIGKILL
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.kill()
