"""Retries of transient storage errors, clear permanent failures, and FaultyFileSystem."""

from __future__ import annotations

import errno
import json
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from conftest import Location
from fsspec.implementations.memory import MemoryFileSystem
from s3fs.errors import translate_boto_error

from lumos.storage import (
    CheckpointRecord,
    RetentionPolicy,
    RetryPolicy,
    RunState,
    RunStorage,
    StorageIOError,
    get_retry_policy,
    is_transient,
    set_retry_policy,
)
from lumos.storage._internal.retry import retry_call
from lumos.storage.testing import (
    FAST_RETRY_POLICY,
    FAULTS_ENV,
    FaultyFileSystem,
    read_fault_records,
)

FAST = FAST_RETRY_POLICY


@pytest.fixture
def fast_retries() -> Iterator[RetryPolicy]:
    previous = set_retry_policy(FAST)
    yield FAST
    set_retry_policy(previous)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


# -- classification ---------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(errno.ECONNRESET, "reset"),
        TimeoutError("timed out"),
        OSError(errno.EBUSY, "SlowDown"),
        OSError(errno.EREMOTEIO, "InternalError"),
        _client_error("SlowDown", 503),
        _client_error("InternalError", 500),
        _client_error("Throttling", 400),
        translate_boto_error(_client_error("SlowDown", 503)),
        translate_boto_error(_client_error("ServiceUnavailable", 503)),
        translate_boto_error(_client_error("RequestTimeout", 400)),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ],
    ids=repr,
)
def test_transient_errors(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        PermissionError(errno.EACCES, "denied"),
        FileNotFoundError(errno.ENOENT, "missing"),
        OSError(errno.EINVAL, "bad request"),
        _client_error("AccessDenied", 403),
        _client_error("NoSuchBucket", 404),
        translate_boto_error(_client_error("AccessDenied", 403)),
        translate_boto_error(_client_error("NoSuchBucket", 404)),
        translate_boto_error(_client_error("InvalidArgument", 400)),
        ValueError("bad value"),
    ],
    ids=repr,
)
def test_permanent_errors(exc: BaseException) -> None:
    assert not is_transient(exc)


# -- retry policy -----------------------------------------------------------------


def _failing(times: int, exc: Callable[[], BaseException]) -> tuple[Callable[[], str], list[int]]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc()
        return "done"

    return fn, calls


def test_transient_errors_are_retried_until_success() -> None:
    fn, calls = _failing(3, lambda: ConnectionResetError(errno.ECONNRESET, "reset"))
    assert retry_call("write", "b/k", fn, policy=FAST) == "done"
    assert len(calls) == 4


def test_transient_errors_past_max_attempts_fail_clearly() -> None:
    fn, calls = _failing(100, lambda: OSError(errno.EBUSY, "SlowDown: reduce your rate"))
    with pytest.raises(StorageIOError) as info:
        retry_call("write", "b/runs/r/_lumos/run_state.json", fn, policy=FAST)
    assert len(calls) == FAST.max_attempts
    err = info.value
    assert err.transient
    assert err.attempts == FAST.max_attempts
    assert err.operation == "write"
    assert err.path == "b/runs/r/_lumos/run_state.json"
    message = str(err)
    assert "Storage write failed on 'b/runs/r/_lumos/run_state.json'" in message
    assert "SlowDown: reduce your rate" in message
    assert "max_attempts=8" in message
    assert "LUMOS_STORAGE_RETRY" in message
    assert pickle.loads(pickle.dumps(err)).args == err.args


def test_total_time_bounds_retries() -> None:
    fn, calls = _failing(100, lambda: TimeoutError("slow"))
    policy = RetryPolicy(max_attempts=50, initial_backoff_s=0.001, max_total_s=0.0)
    with pytest.raises(StorageIOError):
        retry_call("read", "p", fn, policy=policy)
    assert len(calls) == 1


def test_permanent_error_is_not_retried_and_names_operation_path_cause() -> None:
    fn, calls = _failing(1, lambda: PermissionError(errno.EACCES, "Access Denied"))
    with pytest.raises(StorageIOError) as info:
        retry_call("upload", "b/run/ckpt/model.pt", fn, policy=FAST)
    assert len(calls) == 1
    assert not info.value.transient
    assert str(info.value).startswith(
        "Storage upload failed on 'b/run/ckpt/model.pt': PermissionError: [Errno 13] Access Denied;"
    )
    assert "permanent error, not retried" in str(info.value)
    assert isinstance(info.value.__cause__, PermissionError)


def test_passthrough_errors_reach_the_caller_unchanged() -> None:
    fn, calls = _failing(1, lambda: FileNotFoundError("gone"))
    with pytest.raises(FileNotFoundError):
        retry_call("read", "p", fn, passthrough=(FileNotFoundError,), policy=FAST)
    assert len(calls) == 1


def test_backoff_bounds_grow_and_are_capped() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, multiplier=2.0, max_backoff_s=0.5)
    assert [policy.backoff_bound_s(n) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"initial_backoff_s": -1.0}, "initial_backoff_s=-1.0"),
        ({"multiplier": 0.5}, "multiplier=0.5"),
        ({"max_total_s": "soon"}, "max_total_s='soon'"),
    ],
)
def test_invalid_policy_names_the_field(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_set_retry_policy_returns_previous() -> None:
    before = get_retry_policy()
    previous = set_retry_policy(FAST)
    try:
        assert previous == before
        assert get_retry_policy() == FAST
    finally:
        set_retry_policy(previous)


# -- FaultyFileSystem -------------------------------------------------------------


def _fault_pattern(fs: FaultyFileSystem, n: int = 40) -> list[str]:
    out = []
    for i in range(n):
        try:
            fs.pipe_file(f"/pattern/{i}", b"x")
            out.append("ok")
        except OSError as exc:
            out.append(type(exc).__name__)
    return out


def test_faults_are_seeded_counted_and_transient() -> None:
    a = FaultyFileSystem(MemoryFileSystem(), seed=7, write_failure_rate=0.5)
    b = FaultyFileSystem(MemoryFileSystem(), seed=7, write_failure_rate=0.5)
    pattern = _fault_pattern(a)
    assert pattern == _fault_pattern(b)
    assert 0 < a.injected["write"] < 40
    assert a.calls["write"] == 40
    assert a.injected["write"] == sum(p != "ok" for p in pattern)
    assert set(pattern) - {"ok"} <= {"ConnectionResetError", "TimeoutError", "OSError"}
    assert pattern != _fault_pattern(
        FaultyFileSystem(MemoryFileSystem(), seed=8, write_failure_rate=0.5)
    )


def test_each_kind_is_faulted_and_switches_off(tmp_path: Path) -> None:
    inner = MemoryFileSystem()
    root = f"/kinds-{os.getpid()}"
    inner.pipe_file(f"{root}/a", b"1")
    fs = FaultyFileSystem(
        inner,
        write_failure_rate=1.0,
        rename_failure_rate=1.0,
        list_failure_rate=1.0,
        read_failure_rate=1.0,
        delete_failure_rate=1.0,
    )
    calls: dict[str, Callable[[], object]] = {
        "write": lambda: fs.pipe_file(f"{root}/b", b"2"),
        "rename": lambda: fs.mv(f"{root}/a", f"{root}/c"),
        "list": lambda: fs.ls(root),
        "read": lambda: fs.cat_file(f"{root}/a"),
        "delete": lambda: fs.rm_file(f"{root}/a"),
    }
    for kind, call in calls.items():
        with pytest.raises(OSError) as info:
            call()
        assert is_transient(info.value), kind
    assert dict(fs.injected) == dict.fromkeys(calls, 1)
    with pytest.raises(OSError):
        fs.exists(f"{root}/a")  # a failed lookup raises; it is not a silent False
    fs.set_faults(enabled=False)
    assert fs.cat_file(f"{root}/a") == b"1"
    fs.clear_overrides()
    with pytest.raises(OSError):
        fs.cat_file(f"{root}/a")
    inner.rm(root, recursive=True)


def test_permanent_mode_raises_permission_errors() -> None:
    fs = FaultyFileSystem(MemoryFileSystem(), write_failure_rate=1.0, permanent=True)
    with pytest.raises(PermissionError) as info:
        fs.pipe_file("/perm/x", b"1")
    assert not is_transient(info.value)


def test_max_consecutive_lets_the_next_attempt_through() -> None:
    fs = FaultyFileSystem(MemoryFileSystem(), write_failure_rate=1.0, max_consecutive=2)
    outcomes = []
    for _ in range(3):
        try:
            fs.pipe_file("/streak/x", b"1")
            outcomes.append("ok")
        except OSError:
            outcomes.append("fault")
    assert outcomes == ["fault", "fault", "ok"]


def test_invalid_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"write_failure_rate=1.5 must be in \[0, 1\]"):
        FaultyFileSystem(MemoryFileSystem(), write_failure_rate=1.5)
    with pytest.raises(ValueError, match="unknown fault setting 'write_rate'"):
        FaultyFileSystem(MemoryFileSystem()).set_faults(write_rate=0.1)
    with pytest.raises(ValueError, match="max_consecutive=0"):
        FaultyFileSystem(MemoryFileSystem(), max_consecutive=0)


def test_pickled_copy_keeps_its_rates() -> None:
    fs = FaultyFileSystem(MemoryFileSystem(), seed=3, read_failure_rate=0.25, max_consecutive=2)
    copy = pickle.loads(pickle.dumps(fs))
    assert isinstance(copy, FaultyFileSystem)
    assert copy is not fs
    assert copy.settings == fs.settings
    assert copy.settings["read_failure_rate"] == 0.25
    assert copy.seed == 3


def test_environment_and_control_file_drive_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"write_failure_rate": 1.0}))
    control = tmp_path / "faults.json"
    records = tmp_path / "records"
    fs = FaultyFileSystem(MemoryFileSystem(), control_file=str(control), record_dir=str(records))
    assert fs.settings["write_failure_rate"] == 1.0  # from the environment
    with pytest.raises(OSError):
        fs.pipe_file("/ctl/x", b"1")

    def write_control(doc: dict[str, object]) -> None:
        tmp = tmp_path / "faults.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, control)
        stamp = os.stat(control).st_mtime_ns + len(json.dumps(doc))  # a new mtime each time
        os.utime(control, ns=(stamp, stamp))

    write_control({"enabled": False})
    fs.pipe_file("/ctl/x", b"1")
    write_control({"enabled": True, "write_failure_rate": 0.0, "read_failure_rate": 1.0})
    fs.pipe_file("/ctl/y", b"1")
    with pytest.raises(OSError):
        fs.cat_file("/ctl/y")
    control.write_text("{torn")  # an unreadable file leaves the other settings in force
    os.utime(control, ns=(1, 1))
    with pytest.raises(OSError):
        fs.pipe_file("/ctl/z", b"1")
    assert read_fault_records(str(records)) == {"write": 2, "read": 1}
    MemoryFileSystem().rm("/ctl", recursive=True)


# -- RunStorage over faulty storage -----------------------------------------------


def _faulty(location: Location, **rates: float) -> FaultyFileSystem:
    inner = location.filesystem or RunStorage(location.storage_path, "x").fs
    return FaultyFileSystem(inner, seed=11, max_consecutive=3, **rates)


def test_transient_faults_during_commits_are_retried(
    location: Location, fast_retries: RetryPolicy, make_local_dir: Callable[..., Path]
) -> None:
    faulty = _faulty(
        location,
        write_failure_rate=0.5,
        rename_failure_rate=0.5,
        list_failure_rate=0.5,
        read_failure_rate=0.5,
        delete_failure_rate=0.5,
    )
    storage = RunStorage(location.storage_path, "run", faulty)
    state = RunState(name="run")
    storage.save_state(state)
    retention = RetentionPolicy(num_to_keep=2)
    for i in range(6):
        local = make_local_dir({"model.bin": bytes([i]) * 1000, f"shard/{i}.bin": b"s" * 10})
        storage.persist_directory(local, f"ckpt-{i}")
        state, _ = storage.commit_checkpoint(
            state, CheckpointRecord(dir_name=f"ckpt-{i}", report_index=i), retention
        )
        storage.append_metrics([{"step": i}], i)
    storage.rename_checkpoint("ckpt-5", "ckpt-5-renamed")
    storage.rename_checkpoint("ckpt-5-renamed", "ckpt-5")
    assert faulty.injected["write"] >= 1
    assert sum(faulty.injected.values()) >= 5

    faulty.set_faults(enabled=False)  # check with a clean view
    clean = RunStorage(location.storage_path, "run", faulty.fs)
    loaded = clean.load_state()
    assert loaded is not None
    assert loaded.checkpoint_names() == ["ckpt-4", "ckpt-5"]
    for i in (4, 5):
        with clean.checkpoint(f"ckpt-{i}").as_directory() as d:
            assert Path(d, "model.bin").read_bytes() == bytes([i]) * 1000
            assert Path(d, "shard", f"{i}.bin").read_bytes() == b"s" * 10
    assert clean.read_metrics() == [{"step": i} for i in range(6)]
    assert clean.list_uncommitted() == []
    assert [p for p in clean.fs.find(clean.run_path) if ".tmp-" in p] == []


def test_permanent_fault_fails_commit_clearly_and_keeps_committed_state(
    location: Location, fast_retries: RetryPolicy, make_local_dir: Callable[..., Path]
) -> None:
    faulty = _faulty(location)
    storage = RunStorage(location.storage_path, "run", faulty)
    state = RunState(name="run")
    storage.save_state(state)
    storage.persist_directory(make_local_dir({"w.bin": b"first"}), "ckpt-0")
    state, _ = storage.commit_checkpoint(state, CheckpointRecord(dir_name="ckpt-0"))
    before = storage.load_state()

    storage.persist_directory(make_local_dir({"w.bin": b"second"}), "ckpt-1")
    faulty.set_faults(write_failure_rate=1.0, permanent=True)
    faulty.reset_counts()
    with pytest.raises(StorageIOError) as info:
        storage.commit_checkpoint(state, CheckpointRecord(dir_name="ckpt-1", report_index=1))
    err = info.value
    assert err.operation == "write"
    assert err.path == storage.state_path
    assert not err.transient
    assert f"Storage write failed on {storage.state_path!r}: PermissionError" in str(err)
    assert faulty.calls["write"] == faulty.injected["write"] == 1  # not retried

    with pytest.raises(StorageIOError, match=r"Storage upload failed on .*ckpt-2.*PermissionError"):
        storage.persist_directory(make_local_dir({"w.bin": b"third"}), "ckpt-2")

    faulty.set_faults(enabled=False)
    assert storage.load_state() == before
    with storage.checkpoint("ckpt-0").as_directory() as d:
        assert Path(d, "w.bin").read_bytes() == b"first"
    # the uncommitted upload is recognised as such and cleaned up like any other
    assert "ckpt-1" in storage.list_uncommitted()
    storage.delete_uncommitted()
    assert storage.list_uncommitted() == []
    assert [p for p in faulty.fs.find(storage.run_path) if ".tmp-" in p] == []
    assert storage.list_checkpoints() == [storage.checkpoint("ckpt-0")]


def test_transient_faults_past_the_budget_name_the_retry_policy(
    location: Location, make_local_dir: Callable[..., Path]
) -> None:
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.001)
    previous = set_retry_policy(policy)
    try:
        faulty = _faulty(location, write_failure_rate=1.0)
        faulty.set_faults(max_consecutive=None)
        storage = RunStorage(location.storage_path, "run", faulty)
        with pytest.raises(StorageIOError) as info:
            storage.save_state(RunState(name="run"))
    finally:
        set_retry_policy(previous)
    assert info.value.transient
    assert info.value.attempts == 2
    assert "transient errors persisted through 2 attempts" in str(info.value)
    assert faulty.injected["write"] == 2
    faulty.set_faults(enabled=False)
    assert storage.load_state() is None  # nothing half-written
