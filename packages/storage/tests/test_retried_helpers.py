"""The retried helpers (``lumos.storage.retried_*``, ``AppendOnlyFile``) over faulty storage.

Every helper is run on local disk, memory and a real S3 API (moto's server on
loopback), wrapped in ``FaultyFileSystem``: transient faults (connection resets,
``TimeoutError(ETIMEDOUT)``, ``SlowDown``) are retried until the operation succeeds;
a permanent fault raises ``StorageIOError`` naming the operation and the path and
leaves what was there before as it was. A full disk (``ENOSPC``) is permanent.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Location

from lumos.storage import (
    AppendOnlyFile,
    RetryPolicy,
    RunStorage,
    StorageIOError,
    is_transient,
    retried_copy_tree,
    retried_download,
    retried_exists,
    retried_find,
    retried_isdir,
    retried_ls,
    retried_makedirs,
    retried_put_file,
    retried_read,
    retried_rm,
    retried_write,
    retry_call,
    set_retry_policy,
)
from lumos.storage.testing import FAST_RETRY_POLICY, FaultyFileSystem, read_fault_records

FAST = FAST_RETRY_POLICY
ALL_KINDS = ("write", "rename", "list", "read", "delete")


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[RetryPolicy]:
    previous = set_retry_policy(FAST)
    yield FAST
    set_retry_policy(previous)


def _faulty(location: Location, records: Path, **settings: object) -> FaultyFileSystem:
    inner = location.filesystem or RunStorage(location.storage_path, "x").fs
    return FaultyFileSystem(inner, seed=4, max_consecutive=3, record_dir=str(records), **settings)


def _root(location: Location, fs: FaultyFileSystem) -> str:
    return RunStorage(location.storage_path, "run", fs).run_path


def _every_helper(fs: FaultyFileSystem, root: str, local_src: Path, local_dest: Path) -> None:
    """Each helper once, checking what it returns against the storage underneath."""
    retried_makedirs(fs, f"{root}/a")
    for version in range(3):  # overwritten whole each time
        retried_write(fs, f"{root}/a/x.bin", bytes([version]) * 100)
    retried_write(fs, f"{root}/a/x.bin", b"x" * 100)
    retried_write(fs, f"{root}/a/sub/y.bin", b"y")
    retried_put_file(fs, str(local_src), f"{root}/a/z.bin")
    assert retried_read(fs, f"{root}/a/x.bin") == b"x" * 100
    assert retried_read(fs, f"{root}/a/missing.bin") is None
    assert retried_exists(fs, f"{root}/a/x.bin")
    assert not retried_exists(fs, f"{root}/nothing")
    assert retried_isdir(fs, f"{root}/a")
    names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in retried_ls(fs, f"{root}/a"))
    assert names == ["sub", "x.bin", "z.bin"]
    assert retried_ls(fs, f"{root}/nothing") == []
    assert [p.rsplit("/", 1)[-1] for p in retried_find(fs, f"{root}/a")] == [
        "y.bin",
        "x.bin",
        "z.bin",
    ]
    assert retried_find(fs, f"{root}/nothing") == []
    assert retried_copy_tree(fs, f"{root}/a", f"{root}/b") == ["sub/y.bin", "x.bin", "z.bin"]
    retried_download(fs, f"{root}/b", str(local_dest))
    assert (local_dest / "sub" / "y.bin").read_bytes() == b"y"
    assert (local_dest / "z.bin").read_bytes() == local_src.read_bytes()
    assert retried_rm(fs, f"{root}/a", recursive=True)
    assert not retried_rm(fs, f"{root}/a", recursive=True)  # gone: nothing to do
    assert not retried_exists(fs, f"{root}/a/x.bin")


def test_transient_faults_are_retried_until_every_helper_succeeds(
    location: Location, tmp_path: Path
) -> None:
    records = tmp_path / "faults"
    rates = {f"{kind}_failure_rate": 0.5 for kind in ALL_KINDS}
    fs = _faulty(location, records, **rates)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3000))
    _every_helper(fs, _root(location, fs), src, tmp_path / "down")
    injected = read_fault_records(str(records))
    assert set(injected) == set(ALL_KINDS), injected
    kinds_of_errors = {
        json.loads(line)["error"]
        for name in os.listdir(records)
        for line in (records / name).read_text().splitlines()
    }
    assert "TimeoutError" in kinds_of_errors  # ETIMEDOUT (errno 110) among them


def _permanent_cases(
    fs: FaultyFileSystem, root: str, src: Path, down: Path
) -> list[tuple[str, str, str, Callable[[], object]]]:
    """``(fault kind, operation, path, call)`` for each helper."""
    return [
        (
            "write",
            "write",
            f"{root}/kept.bin",
            lambda: retried_write(fs, f"{root}/kept.bin", b"new"),
        ),
        (
            "write",
            "upload",
            f"{root}/up.bin",
            lambda: retried_put_file(fs, str(src), f"{root}/up.bin"),
        ),
        ("read", "read", f"{root}/kept.bin", lambda: retried_read(fs, f"{root}/kept.bin")),
        ("list", "list", f"{root}/dir", lambda: retried_ls(fs, f"{root}/dir")),
        ("list", "list", f"{root}/kept.bin", lambda: retried_exists(fs, f"{root}/kept.bin")),
        ("delete", "delete", f"{root}/dir", lambda: retried_rm(fs, f"{root}/dir", recursive=True)),
        (
            "rename",
            "copy",
            f"{root}/dir/f.bin",
            lambda: retried_copy_tree(fs, f"{root}/dir", f"{root}/copy"),
        ),
        (
            "read",
            "download",
            f"{root}/dir/f.bin",
            lambda: retried_download(fs, f"{root}/dir", str(down)),
        ),
    ]


def test_a_permanent_fault_names_operation_and_path_and_keeps_what_was_there(
    location: Location, tmp_path: Path
) -> None:
    fs = _faulty(location, tmp_path / "faults")
    root = _root(location, fs)
    src = tmp_path / "src.bin"
    src.write_bytes(b"local")
    retried_write(fs, f"{root}/kept.bin", b"old")
    retried_write(fs, f"{root}/dir/f.bin", b"f")
    for kind, operation, path, call in _permanent_cases(fs, root, src, tmp_path / "down"):
        fs.set_faults(**{f"{kind}_failure_rate": 1.0}, permanent=True)
        fs.reset_counts()
        with pytest.raises(StorageIOError) as info:
            call()
        err = info.value
        assert (err.operation, err.path, err.transient, err.attempts) == (operation, path, False, 1)
        assert f"Storage {operation} failed on {path!r}: PermissionError" in str(err)
        assert fs.injected[kind] == 1  # not retried
        fs.clear_overrides()
        assert retried_read(fs, f"{root}/kept.bin") == b"old"
        assert retried_read(fs, f"{root}/dir/f.bin") == b"f"
    assert not retried_exists(fs, f"{root}/up.bin")


# -- AppendOnlyFile: a retried append lands exactly once ----------------------------


def test_an_append_torn_by_a_transient_error_is_rewritten_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = AppendOnlyFile(str(tmp_path / "j" / "events.jsonl"))
    log.append(b'{"n": 0}\n')
    real_write = os.write
    failures = [2]

    def short_write_then_eio(fd: int, data: bytes | memoryview) -> int:
        # The disk takes half of the chunk, then the device reports an I/O error.
        if failures[0] and len(data) > 4:
            failures[0] -= 1
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", short_write_then_eio)
    log.append(b'{"n": 1}\n{"n": 2}\n')
    monkeypatch.setattr(os, "write", real_write)
    log.append(b'{"n": 3}\n')
    log.close()
    lines = (tmp_path / "j" / "events.jsonl").read_bytes().splitlines()
    assert lines == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert log.size == len(b"\n".join(lines)) + 1


_FSIZE_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from lumos.storage import AppendOnlyFile, StorageIOError
    path = sys.argv[1]
    log = AppendOnlyFile(path)
    log.append(b"a" * 100)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (150, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        log.append(b"b" * 100)  # the kernel takes 50 bytes, then refuses the rest
    except StorageIOError as exc:
        print(json.dumps({"op": exc.operation, "transient": exc.transient,
                          "attempts": exc.attempts, "message": str(exc)}))
    """
)


def test_an_append_that_fails_for_good_part_way_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["op"] == "append"
    assert not result["transient"]
    assert result["attempts"] == 1
    assert "File too large" in result["message"]
    assert path.read_bytes() == b"a" * 100  # the torn 50 bytes were cut off


def test_a_torn_tail_is_cut_and_appends_go_on_after_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"1\n2\n3")  # a writer was killed mid-line
    log = AppendOnlyFile(str(path))
    log.truncate(4)
    log.append(b"4\n")
    log.close()
    log.append(b"5\n")  # reopens
    log.close()
    assert path.read_bytes() == b"1\n2\n4\n5\n"


# -- a full disk is permanent, and says so -------------------------------------------


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_disk_full_quota_and_read_only_errors_are_permanent(code: int) -> None:
    assert not is_transient(OSError(code, os.strerror(code)))
    wrapped = RuntimeError("upload failed")
    wrapped.__cause__ = OSError(code, os.strerror(code))
    assert not is_transient(wrapped)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_enospc_on_local_storage_is_not_retried_and_says_the_disk_is_full() -> None:
    log = AppendOnlyFile("/dev/full")  # every write: ENOSPC, as on a full disk
    with pytest.raises(StorageIOError) as info:
        log.append(b"record\n")
    err = info.value
    assert (err.operation, err.path, err.transient, err.attempts) == (
        "append",
        "/dev/full",
        False,
        1,
    )
    message = str(err)
    assert "Storage append failed on '/dev/full'" in message
    assert "ENOSPC" in message
    assert "no space left on device" in message.lower()
    assert "disk or quota is full" in message

    def write_full() -> None:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"state")

    with pytest.raises(StorageIOError, match=r"ENOSPC: no space left on device") as info2:
        retry_call("write", "/dev/full", write_full)
    assert info2.value.attempts == 1


# -- the lumos command's reads ---------------------------------------------------------


def test_the_lumos_commands_reads_retry_transient_faults(
    location: Location, tmp_path: Path
) -> None:
    from lumos.storage import RunState
    from lumos.storage._internal.run_view import describe_run, load_run, nested_runs

    parent = location.storage("sweep")
    parent.save_state(RunState(name="sweep"))
    for name in ("trial_00000", "trial_00001"):
        parent.child(name).save_state(RunState(name=name))
    fs = _faulty(location, tmp_path / "faults", list_failure_rate=0.6, read_failure_rate=0.6)
    run = load_run(fs, RunStorage(location.storage_path, "sweep", fs).run_path)
    assert run.state.name == "sweep"
    assert nested_runs(run) == ["trial_00000", "trial_00001"]
    assert describe_run(run)["name"] == "sweep"
    assert fs.injected["list"] + fs.injected["read"] >= 1
