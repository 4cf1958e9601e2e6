from __future__ import annotations

import json
import os
import pickle
import socket
import time

import pytest
from storage_test_helpers import Child

from lumos.storage import LeaseHeldError, RunStorage, StorageError


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_second_live_holder_gets_a_clear_error(location) -> None:
    storage = location.storage("run-7")
    first = storage.acquire_lease(holder="driver-a", ttl_s=60)
    with pytest.raises(LeaseHeldError) as info:
        storage.acquire_lease(holder="driver-b", ttl_s=60)
    err = info.value
    msg = str(err)
    assert storage.uri in msg
    assert "run-7" in msg
    assert "driver-a" in msg
    assert f"host={socket.gethostname()!r}" in msg
    assert f"pid={os.getpid()}" in msg
    assert (err.holder, err.host, err.pid) == ("driver-a", socket.gethostname(), os.getpid())
    assert isinstance(err, StorageError)
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == msg
    assert clone.pid == err.pid
    first.release()
    with storage.acquire_lease(holder="driver-b") as second:
        assert not second.released
    assert second.released
    second.release()  # idempotent
    storage.acquire_lease(holder="driver-c").release()


def test_expired_lease_is_taken_over_and_old_holder_learns_it(location) -> None:
    clock = FakeClock()
    storage = location.storage()
    old = storage.acquire_lease(holder="old", ttl_s=10, clock=clock)
    clock.now += 8
    old.renew()  # now valid until +18
    clock.now += 9
    with pytest.raises(LeaseHeldError, match="old"):
        storage.acquire_lease(holder="new", ttl_s=10, clock=clock)
    clock.now += 2  # past the renewed expiry: the holder stopped renewing
    new = storage.acquire_lease(holder="new", ttl_s=10, clock=clock)
    with pytest.raises(LeaseHeldError, match="Lost the lease"):
        old.renew()
    old.release()  # does not delete the new holder's lease
    with pytest.raises(LeaseHeldError, match="new"):
        storage.acquire_lease(holder="third", ttl_s=10, clock=clock)
    new.release()


def test_lease_of_another_host_is_respected_until_it_expires(location) -> None:
    storage = location.storage()
    now = time.time()
    doc = {
        "holder": "remote",
        "host": "other-host.invalid",
        "pid": 1,
        "token": "t",
        "acquired_at": now,
        "expires_at": now + 600,
        "ttl_s": 600,
    }
    storage.fs.makedirs(storage.state_dir, exist_ok=True)
    storage.fs.pipe_file(storage.state_dir + "/lease.json", json.dumps(doc).encode())
    with pytest.raises(LeaseHeldError, match=r"other-host\.invalid"):
        storage.acquire_lease()
    doc["expires_at"] = now - 1
    storage.fs.pipe_file(storage.state_dir + "/lease.json", json.dumps(doc).encode())
    storage.acquire_lease().release()


def test_start_renewing_extends_the_lease(location) -> None:
    storage = location.storage()
    lease = storage.acquire_lease(ttl_s=30)
    path = storage.state_dir + "/lease.json"
    first = json.loads(storage.fs.cat_file(path))["expires_at"]
    lease.start_renewing(interval_s=0.05)
    deadline = time.monotonic() + 60
    renewed = first
    while renewed == first and time.monotonic() < deadline:
        time.sleep(0.02)
        renewed = json.loads(storage.fs.cat_file(path))["expires_at"]
    assert renewed > first
    lease.release()
    storage.fs.invalidate_cache()
    assert not storage.fs.exists(path)


def test_ttl_must_be_positive(tmp_path) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        RunStorage(tmp_path, "run").acquire_lease(ttl_s=0)


def test_killed_driver_on_this_host_releases_at_once(tmp_path, children) -> None:
    storage_path = str(tmp_path / "runs")
    child = Child("lease", storage_path, "run")
    children.append(child)
    pid = int(child.wait_for("LEASED").split()[1])
    storage = RunStorage(storage_path, "run")
    with pytest.raises(LeaseHeldError) as info:
        storage.acquire_lease(ttl_s=300)
    assert info.value.pid == pid
    assert "child-driver" in str(info.value)
    child.kill()  # SIGKILL: no chance to release; TTL (300 s) far from expired
    lease = storage.acquire_lease(holder="successor", ttl_s=300)
    assert not lease.released
    with pytest.raises(LeaseHeldError, match="successor"):
        storage.acquire_lease(ttl_s=300)
    lease.release()


def test_reused_pid_does_not_keep_a_dead_lease(tmp_path) -> None:
    storage = RunStorage(tmp_path, "run")
    now = time.time()
    # Our own pid but another process start time: the original holder is gone.
    doc = {
        "holder": "ghost",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": "1",
        "token": "t",
        "acquired_at": now,
        "expires_at": now + 600,
        "ttl_s": 600,
    }
    os.makedirs(storage.state_dir)
    with open(os.path.join(storage.state_dir, "lease.json"), "w") as f:
        json.dump(doc, f)
    lease = storage.acquire_lease(holder="new-driver")
    with open(os.path.join(storage.state_dir, "lease.json")) as f:
        assert json.load(f)["holder"] == "new-driver"
    lease.release()


def test_racing_acquirers_on_local_disk_get_exactly_one_lease(tmp_path) -> None:
    import threading

    storage = RunStorage(tmp_path, "run")
    start = threading.Barrier(8)
    won: list[str] = []
    lost: list[str] = []

    def contend(i: int) -> None:
        start.wait(timeout=60)
        try:
            storage.acquire_lease(holder=f"h{i}", ttl_s=60)
            won.append(f"h{i}")
        except LeaseHeldError:
            lost.append(f"h{i}")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(won) == 1
    assert len(lost) == 7


def test_a_driver_that_lost_its_lease_writes_nothing_more(location) -> None:
    # Soak finding: a driver stopped past its lease (SIGSTOP) was taken over, was
    # resumed, and went on committing, and its retention deleted the new driver's
    # checkpoints. Its writes are fenced: the first one after the takeover fails.
    from lumos.storage import RunState

    clock = FakeClock()
    stale = location.storage("fenced")
    stale.acquire_lease(holder="stale", ttl_s=10, clock=clock)
    stale.save_state(RunState(name="fenced"))
    clock.now += 11  # stopped: no renewal for longer than ttl_s
    owner = RunStorage(stale.storage_path, "fenced", stale.fs)
    lease = owner.acquire_lease(holder="owner", ttl_s=10, clock=clock)
    owner.save_state(RunState(name="fenced", report_count=7))
    for write in (
        lambda: stale.save_state(RunState(name="fenced", report_count=1)),
        lambda: stale.delete_uncommitted(),
        lambda: stale.append_metrics([{"step": 1}], 0),
    ):
        with pytest.raises(LeaseHeldError, match="lost the lease"):
            write()
    state = owner.load_state()
    assert state is not None
    assert state.report_count == 7
    lease.release()


def test_a_late_renewal_that_finds_the_lease_free_goes_on(location) -> None:
    from lumos.storage import RunState

    clock = FakeClock()
    storage = location.storage("late")
    storage.acquire_lease(holder="late", ttl_s=10, clock=clock)
    clock.now += 11  # late, but nobody took the run over
    storage.save_state(RunState(name="late"))  # renews first, then writes
    assert storage.load_state() is not None


def test_process_running_is_the_leases_check_of_its_holder() -> None:
    import subprocess
    import sys

    from lumos.storage._internal.lease import _proc_start_time
    from lumos.storage.testing import process_running

    me = os.getpid()
    assert process_running(me)
    assert process_running(me, _proc_start_time(me))
    assert not process_running(me, "1")  # the pid now names another process
    assert not process_running(0)
    assert not process_running(-5)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while process_running(child.pid):  # exited, not reaped yet: a zombie is not running
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.05)
    child.wait()
    assert not process_running(child.pid)  # reaped: gone
