"""The lease across hosts that share a hostname (found by ``integration-tests/hosts``).

Two hosts may have the same hostname (cloud images, containers started with one
``--hostname``). A driver on one used to check the other's pid in its own process
table, find it dead and take the lease of a live driver: two drivers writing one run.
The lease now records the holder's machine (boot id and PID namespace) and checks the
pid only on that machine; elsewhere the lease holds until it expires.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from lumos.storage import LeaseHeldError, RunStorage
from lumos.storage._internal.lease import _machine_id


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _write_lease(storage: RunStorage, machine: str | None) -> None:
    now = time.time()
    doc = {
        "holder": "driver-on-a-twin",
        "host": socket.gethostname(),  # the same hostname as this process's
        "pid": _dead_pid(),  # no such process here
        "token": "t",
        "acquired_at": now,
        "expires_at": now + 600,
        "ttl_s": 600,
    }
    if machine is not None:
        doc["machine"] = machine
    storage.fs.makedirs(storage.state_dir, exist_ok=True)
    storage.fs.pipe_file(storage.state_dir + "/lease.json", json.dumps(doc).encode())


def test_a_live_lease_of_another_machine_with_this_hostname_is_respected(tmp_path) -> None:
    storage = RunStorage(str(tmp_path), "run")
    _write_lease(storage, machine="another-boot-id/pid:[4026531836]")
    with pytest.raises(LeaseHeldError, match="driver-on-a-twin"):
        storage.acquire_lease()


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(tmp_path) -> None:
    storage = RunStorage(str(tmp_path), "run")
    _write_lease(storage, machine=_machine_id())
    storage.acquire_lease(holder="successor").release()


def test_a_lease_without_a_machine_is_checked_by_hostname_as_before(tmp_path) -> None:
    storage = RunStorage(str(tmp_path), "run")
    _write_lease(storage, machine=None)  # written by an older lumos
    storage.acquire_lease(holder="successor").release()


def test_the_lease_records_its_machine(tmp_path) -> None:
    storage = RunStorage(str(tmp_path), "run")
    with storage.acquire_lease() as lease:
        doc = json.loads(storage.fs.cat_file(storage.state_dir + "/lease.json"))
        assert doc["machine"] == lease.machine == _machine_id()
        if sys.platform.startswith("linux"):
            assert "pid:[" in doc["machine"]
