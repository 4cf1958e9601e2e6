from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from lumos.storage import Checkpoint, MissingBackendError, StorageError, resolve_filesystem

FILES = {"model.pt": b"weights" * 1000, "optim/state.bin": b"\x00\x01" * 500, "a/b/c.txt": b"c"}


def read_tree(root: str | Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = Path(full).read_bytes()
    return out


def persisted(location, make_local_dir) -> Checkpoint:
    storage = location.storage("run")
    return storage.persist_directory(make_local_dir(FILES), "checkpoint_0")


def test_round_trip_to_directory(location, make_local_dir, tmp_path: Path) -> None:
    ckpt = persisted(location, make_local_dir)
    dest = ckpt.to_directory(tmp_path / "restored")
    assert dest == str(tmp_path / "restored")
    assert read_tree(dest) == FILES


def test_to_directory_default_is_a_new_temp_dir(location, make_local_dir) -> None:
    ckpt = persisted(location, make_local_dir)
    first, second = ckpt.to_directory(), ckpt.to_directory()
    try:
        assert first != second
        assert read_tree(first) == FILES
    finally:
        import shutil

        shutil.rmtree(first)
        shutil.rmtree(second)


def test_as_directory(location, make_local_dir) -> None:
    ckpt = persisted(location, make_local_dir)
    with ckpt.as_directory() as d:
        assert read_tree(d) == FILES
        if location.backend == "local":
            assert d == ckpt.path  # no copy when already local
    if location.backend != "local":
        assert not os.path.exists(d)  # the temporary copy is removed


def test_metadata(location, make_local_dir) -> None:
    ckpt = persisted(location, make_local_dir)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "note": "x"})
    ckpt.update_metadata({"epoch": 4, "step": 10})
    other = Checkpoint(ckpt.path, location.fresh_fs())
    assert other.get_metadata() == {"epoch": 4, "note": "x", "step": 10}
    with pytest.raises(TypeError):
        ckpt.set_metadata(["not", "a", "dict"])  # type: ignore[arg-type]


def test_pickle_round_trip(location, make_local_dir, tmp_path: Path) -> None:
    ckpt = persisted(location, make_local_dir)
    clone = pickle.loads(pickle.dumps(ckpt))
    assert clone == ckpt
    assert clone.path == ckpt.path
    assert type(clone.filesystem) is type(ckpt.filesystem)
    assert read_tree(clone.to_directory(tmp_path / "from-clone")) == FILES


def test_uri_resolves_back_to_same_location(location, make_local_dir) -> None:
    ckpt = persisted(location, make_local_dir)
    if location.backend == "s3":
        again = Checkpoint(ckpt.uri, location.fresh_fs())  # endpoint comes with the fs
    else:
        again = Checkpoint(ckpt.uri)
    assert again.path == ckpt.path
    assert again.get_metadata() == {}
    assert "checkpoint_0" in repr(ckpt)


def test_from_directory_local_path(tmp_path: Path, make_local_dir) -> None:
    src = make_local_dir(FILES)
    ckpt = Checkpoint.from_directory(str(src))
    assert isinstance(ckpt.filesystem, LocalFileSystem)
    assert ckpt.path == str(src)
    assert ckpt.is_local()
    assert read_tree(ckpt.to_directory(tmp_path / "copy")) == FILES


def test_home_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    ckpt = Checkpoint("~/ckpts/c0")
    assert ckpt.path == str(tmp_path / "ckpts" / "c0")
    _fs, path = resolve_filesystem("~/runs")
    assert path == str(tmp_path / "runs")
    _fs, path = resolve_filesystem("~/runs", LocalFileSystem())
    assert path == str(tmp_path / "runs")


def test_relative_local_paths_become_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Checkpoint("rel/dir").path == str(tmp_path / "rel" / "dir")


def test_memory_url_and_explicit_filesystem() -> None:
    a = Checkpoint("memory://x/y")
    b = Checkpoint("/x/y", MemoryFileSystem())
    assert isinstance(a.filesystem, MemoryFileSystem)
    assert a.path == b.path == "/x/y"


def test_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Checkpoint(tmp_path / "nope").to_directory(tmp_path / "dest")
    with pytest.raises(FileNotFoundError):
        Checkpoint("memory://lumos-absent/ckpt").to_directory(tmp_path / "dest2")


def test_missing_backend_names_the_package_to_install() -> None:
    with pytest.raises(MissingBackendError) as info:
        Checkpoint("gs://bucket/ckpt")
    msg = str(info.value)
    assert "gcsfs" in msg
    assert "pip install 'lumos-storage[gcs]'" in msg
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, StorageError)
    clone = pickle.loads(pickle.dumps(info.value))
    assert str(clone) == msg


def test_unknown_protocol_is_a_helpful_error() -> None:
    with pytest.raises(MissingBackendError, match="nosuchproto"):
        Checkpoint("nosuchproto://x/y")


def test_file_url_is_local(tmp_path: Path) -> None:
    ckpt = Checkpoint(f"file://{tmp_path}/c")
    assert isinstance(ckpt.filesystem, LocalFileSystem)
    assert ckpt.path == str(tmp_path / "c")


def test_import_is_light() -> None:
    """Importing lumos.storage pulls in neither Ray nor the optional S3/moto stack."""
    import subprocess
    import sys

    code = (
        "import sys, lumos.storage, lumos.storage.testing; "
        "bad = [m for m in ('ray', 's3fs', 'moto', 'boto3', 'torch') if m in sys.modules]; "
        "sys.exit(f'imported: {bad}' if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
