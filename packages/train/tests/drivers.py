"""Drivers in a process of their own, for the tests that kill or stop the driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import HERE, wait_for_no_orphans

from lumos.storage import RunState, RunStorage

_HEAD = """
import sys
sys.path.insert(0, {tests!r})
import ray
from ray import cloudpickle
import {module}
cloudpickle.register_pickle_by_value({module})
ray.init(address={address!r}, log_to_driver=False)
from lumos import train
"""


def start_driver(
    tmp_path: Path, address: str, module: str, body: str, **popen: Any
) -> subprocess.Popen[Any]:
    """Run ``body`` (after ``from lumos import train`` and ``import <module>``, whose
    functions are shipped by value) in a new Python process joined to ``address``."""
    script = tmp_path / "driver.py"
    head = _HEAD.format(tests=str(HERE), module=module, address=address)
    script.write_text(head + textwrap.dedent(body))
    popen.setdefault("stdout", subprocess.DEVNULL)
    return subprocess.Popen([sys.executable, str(script)], **popen)


def wait_for_state(
    proc: subprocess.Popen[Any],
    storage: RunStorage,
    ok: Callable[[RunState], bool],
    what: str,
    timeout_s: float = 180.0,
) -> RunState:
    """Poll the run state the other process writes until ``ok(state)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the driver exited before {what}"
        state = storage.load_state() if storage.exists() else None
        if state is not None and ok(state):
            return state
        assert time.monotonic() < deadline, f"the run never reached {what}"
        time.sleep(0.1)


def kill_driver(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the driver and wait until Ray killed its workers."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    wait_for_no_orphans()
