"""The lease on S3 uses conditional writes (moto's server implements them like AWS)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from conftest import Location

from lumos.storage import LeaseHeldError, RunStorage
from lumos.storage._internal import conditional as cw
from lumos.storage.testing import FaultyFileSystem, S3Server, retry_policy


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return s3.create_bucket()


@pytest.fixture
def fast_retries() -> Iterator[None]:
    with retry_policy():
        yield


def test_conditional_put_and_delete_primitives(s3: S3Server, bucket: str) -> None:
    fs = s3.filesystem()
    path = f"{bucket}/run/_lumos/lease.json"
    assert cw.conditional_backend(fs) is fs
    assert cw.put_if_absent(fs, path, b"a")
    assert not cw.put_if_absent(fs, path, b"b")  # If-None-Match: * refused
    data, etag = cw.read_with_etag(fs, path)
    assert data == b"a"
    assert etag is not None
    assert cw.put_if_match(fs, path, b"c", etag)
    assert not cw.put_if_match(fs, path, b"d", etag)  # the ETag changed with "c"
    assert fs.cat_file(path) == b"c"
    assert not cw.delete_if_match(fs, path, etag)  # stale ETag: not deleted
    _, current = cw.read_with_etag(fs, path)
    assert current is not None
    assert cw.delete_if_match(fs, path, current)
    assert cw.read_with_etag(fs, path) == (None, None)
    assert not cw.put_if_match(fs, path, b"e", current)  # gone: nothing to replace


def test_s3_lease_uses_conditional_writes_and_other_stores_do_not(
    s3: S3Server, bucket: str
) -> None:
    lease = RunStorage(f"{bucket}/runs", "r", s3.filesystem()).acquire_lease("a")
    assert lease._conditional is True
    lease.renew()
    lease.release()
    assert not s3.filesystem().exists(f"{bucket}/runs/r/_lumos/lease.json")
    memory = RunStorage("memory://lease-fallback", "r").acquire_lease("a")
    assert memory._conditional is False
    memory.release()


def test_racing_acquirers_on_s3_get_exactly_one_lease(s3: S3Server, bucket: str) -> None:
    contenders = 4
    for round_ in range(2):
        storages = [
            RunStorage(f"{bucket}/runs", f"race-{round_}", s3.filesystem())
            for _ in range(contenders)
        ]
        barrier = threading.Barrier(contenders)
        winners: list[str] = []
        refused: list[str] = []
        lock = threading.Lock()

        def contend(i: int, storages: list[RunStorage] = storages) -> None:
            barrier.wait(timeout=60)
            try:
                storages[i].acquire_lease(holder=f"driver-{i}", ttl_s=60)
            except LeaseHeldError:
                with lock:
                    refused.append(f"driver-{i}")
                return
            with lock:
                winners.append(f"driver-{i}")

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(winners) == 1, (winners, refused)
        assert len(refused) == contenders - 1
        doc = storages[0].read_json("lease.json")
        assert doc["holder"] == winners[0]


def test_stale_lease_takeover_is_conditional(s3: S3Server, bucket: str) -> None:
    now = [1_000_000.0]
    storage = RunStorage(f"{bucket}/runs", "takeover", s3.filesystem())
    old = storage.acquire_lease("old", ttl_s=10, clock=lambda: now[0])
    now[0] += 60  # the old holder stopped renewing
    path = f"{storage.state_dir}/lease.json"
    _, etag = cw.read_with_etag(storage.fs, path)
    assert etag is not None
    new = storage.acquire_lease("new", ttl_s=10, clock=lambda: now[0])
    # a second contender that read the same stale ETag cannot replace the new lease
    assert not cw.put_if_match(storage.fs, path, b"{}", etag)
    with pytest.raises(LeaseHeldError, match="Lost the lease"):
        old.renew()
    old.release()  # not ours any more: the new holder's lease stays
    assert storage.read_json("lease.json")["holder"] == "new"
    new.release()


def test_lease_on_faulty_s3_retries_and_stays_exclusive(
    s3: S3Server, bucket: str, fast_retries: None
) -> None:
    faulty = FaultyFileSystem(
        s3.filesystem(),
        seed=2,
        write_failure_rate=0.5,
        list_failure_rate=0.5,
        read_failure_rate=0.5,
        max_consecutive=3,
    )
    storage = RunStorage(f"{bucket}/runs", "faulty", faulty)
    lease = storage.acquire_lease("a", ttl_s=60)
    assert lease._conditional is True
    for _ in range(5):
        lease.renew()
    with pytest.raises(LeaseHeldError, match="'a'"):
        RunStorage(f"{bucket}/runs", "faulty", faulty).acquire_lease("b", ttl_s=60)
    lease.release()
    assert sum(faulty.injected.values()) > 0
    faulty.set_faults(enabled=False)
    assert not faulty.exists(f"{storage.state_dir}/lease.json")


def test_lease_conditional_path_on_the_location_fixture(location: Location) -> None:
    """Every backend: acquire, refuse a second driver, release (conditional only on S3)."""
    storage = location.storage("cond")
    lease = storage.acquire_lease("a", ttl_s=60)
    assert lease._conditional is (location.backend == "s3")
    with pytest.raises(LeaseHeldError):
        location.storage("cond").acquire_lease("b", ttl_s=60)
    lease.release()
    location.storage("cond").acquire_lease("b", ttl_s=60).release()
