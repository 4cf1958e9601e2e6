"""Every storage operation of every package goes through the storage retry policy.

The one place is ``lumos.storage``'s retried helpers (``retried_write``,
``retried_read``, ``retried_ls``, ``retried_rm``, ``retried_copy_tree``, ...,
``AppendOnlyFile``: ``packages/storage/src/lumos/storage/_internal/retried.py``), over
``filesystem.py`` and ``retry.py`` inside lumos-storage. This test parses every module
under ``packages/*/src`` and fails on a call that bypasses them:

* ``fs``: an fsspec operation called on a filesystem (``fs.pipe_file(...)``,
  ``storage.fs.rm(...)``, ``self._fs.cat_file(...)``, ``checkpoint.filesystem.exists(...)``):
  a receiver named ``fs``, ``*_fs``, ``*.fs`` or ``*filesystem``. Handing the bound
  method to a retry helper (``fsu.call("list", p, fs.exists, p)``) is not a call here.
* ``local``: a local file operation (builtin ``open``, ``os.open`` / ``os.write`` /
  ``os.replace`` / ``os.truncate`` / ``os.unlink`` ..., ``shutil.rmtree`` / ``copy*``).

``ALLOWED`` lists the exceptions, one ``(module, kind)`` each with the reason; an entry
that no longer matches anything fails too, so the list stays exact. Parsed from the
sources: runs with pytest alone (``nox -s integration``, or directly).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

FS_OPERATIONS = frozenset(
    {
        "cat",
        "cat_file",
        "copy",
        "cp_file",
        "created",
        "delete",
        "download",
        "du",
        "exists",
        "expand_path",
        "find",
        "get",
        "get_file",
        "glob",
        "head",
        "info",
        "isdir",
        "isfile",
        "lexists",
        "listdir",
        "ls",
        "makedirs",
        "mkdir",
        "modified",
        "mv",
        "open",
        "pipe",
        "pipe_file",
        "put",
        "put_file",
        "read_bytes",
        "read_text",
        "rename",
        "rm",
        "rm_file",
        "rmdir",
        "size",
        "tail",
        "touch",
        "upload",
        "walk",
        "write_bytes",
        "write_text",
    }
)
"""fsspec ``AbstractFileSystem`` methods that touch stored data or metadata."""

_FS_RECEIVER = re.compile(r"(^|[._])fs$|filesystem$")

LOCAL_OPERATIONS: dict[str, frozenset[str]] = {
    "os": frozenset(
        {"open", "write", "replace", "rename", "remove", "unlink", "truncate", "ftruncate"}
    ),
    "shutil": frozenset({"rmtree", "copy", "copy2", "copyfile", "copytree", "move"}),
    "fsspec": frozenset({"open", "open_files"}),
}
"""Module-level file operations (``os.replace``, ``shutil.rmtree``, ``fsspec.open``)."""

_TMP = "a local temporary directory of its own, never a run's storage"

ALLOWED: dict[tuple[str, str], str] = {
    # -- the helpers themselves --------------------------------------------------------
    ("storage/src/lumos/storage/_internal/filesystem.py", "local"): (
        "the helpers: atomic local writes (temp file, fsync, os.replace) and reads, each "
        "one whole operation under retry_call"
    ),
    ("storage/src/lumos/storage/_internal/retried.py", "local"): (
        "the helpers: AppendOnlyFile's os.open / os.write / os.truncate, run under retry_call"
    ),
    # -- lumos-storage's own special cases ---------------------------------------------
    ("storage/src/lumos/storage/_internal/faults.py", "fs"): (
        "FaultyFileSystem is a filesystem: each method delegates to the one it wraps; its "
        "callers (these helpers) retry"
    ),
    ("storage/src/lumos/storage/_internal/conditional.py", "fs"): (
        "the conditional PUT runs inside its own retry loop (_retried -> retry_call), which "
        "must tell a failed precondition from an error"
    ),
    ("storage/src/lumos/storage/_internal/lease.py", "local"): (
        "/proc/<pid>/stat and the flock lock file: kernel objects of this host, not stored data"
    ),
    ("train/src/lumos/train/_internal/torch/interfaces.py", "local"): (
        "/proc/net/if_inet6: this host's network interfaces (a kernel table, not stored data)"
    ),
    ("storage/src/lumos/storage/_internal/fault_schedule.py", "local"): (
        "the fault harness's own control and record files (local by definition)"
    ),
    ("storage/src/lumos/storage/_internal/checkpoint.py", "local"): (
        f"as_directory() removes its download: {_TMP}"
    ),
    ("storage/src/lumos/storage/testing.py", "fs"): (
        "s3_server's create_bucket: test setup on the test S3 server, before any run"
    ),
    # -- local files that are not a run's storage --------------------------------------
    ("train/src/lumos/train/_internal/reporting.py", "local"): (
        "delete_local_checkpoint_after_upload removes the user's local checkpoint "
        "directory once it is stored"
    ),
    ("train/src/lumos/train/_internal/uploader.py", "local"): (
        f"the hard-link snapshot of an asynchronous upload: {_TMP}"
    ),
    ("train/src/lumos/train/_internal/hf_transformers.py", "local"): (
        f"links or copies the Trainer's checkpoint files into {_TMP}"
    ),
    ("train/src/lumos/train/_internal/lightning/callback.py", "local"): (
        f"the Lightning checkpoint is saved into {_TMP}"
    ),
    ("train/src/lumos/train/_internal/trackers/mlflow.py", "local"): (
        f"artifacts are downloaded into {_TMP}"
    ),
    ("train/src/lumos/train/_internal/trackers/wandb.py", "local"): (
        f"reads the user's API key file; artifacts go through {_TMP}"
    ),
    ("tune/src/lumos/tune/_internal/trackers.py", "local"): (
        f"reads the user's API key file; artifacts go through {_TMP}"
    ),
    ("tune/src/lumos/tune/_internal/trainable.py", "local"): (
        "a Trainable's dict checkpoint, pickled into the local directory that "
        "persist_directory then uploads (retried)"
    ),
    ("tune/src/lumos/tune/utils/mock_trainable.py", "local"): (
        "Ray's MockTrainable writes its checkpoint into the local directory it is given"
    ),
    ("tune/src/lumos/tune/cli.py", "local"): (f"lumos dashboard's study copy lives in {_TMP}"),
}


def _calls(path: Path) -> list[tuple[int, str, str]]:
    """``(line, kind, call)`` of every storage call in ``path`` (kind: fs or local)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            found.append((node.lineno, "local", "open(...)"))
        elif isinstance(func, ast.Attribute):
            receiver = ast.unparse(func.value)
            if func.attr in LOCAL_OPERATIONS.get(receiver, ()):
                found.append((node.lineno, "local", f"{receiver}.{func.attr}(...)"))
            elif func.attr in FS_OPERATIONS and _FS_RECEIVER.search(receiver):
                found.append((node.lineno, "fs", f"{receiver}.{func.attr}(...)"))
    return found


def scan(packages_dir: Path) -> tuple[list[str], set[tuple[str, str]]]:
    """Calls that bypass the retried helpers, and the allow-list entries that matched."""
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(packages_dir.glob("*/src/**/*.py")):
        rel = path.relative_to(packages_dir).as_posix()
        for lineno, kind, call in sorted(_calls(path)):
            if (rel, kind) in ALLOWED:
                used.add((rel, kind))
            else:
                problems.append(f"packages/{rel}:{lineno}: {call}")
    return problems, used


def test_every_storage_call_goes_through_the_retried_helpers() -> None:
    problems, _ = scan(PACKAGES)
    assert not problems, (
        "storage calls that bypass the retry policy; use lumos.storage's retried helpers "
        "(retried_write / retried_read / retried_exists / retried_ls / retried_find / "
        "retried_rm / retried_copy_tree / retried_put_file / retried_download / "
        "AppendOnlyFile) or, inside lumos-storage, filesystem.py's, or add a justified "
        "entry to ALLOWED:\n" + "\n".join(problems)
    )


def test_every_allowed_exception_is_still_needed() -> None:
    _, used = scan(PACKAGES)
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match no call any more (remove them): {stale}"


def test_the_scan_finds_a_bypass(tmp_path: Path) -> None:
    src = tmp_path / "tune" / "src" / "lumos" / "tune" / "_internal"
    src.mkdir(parents=True)
    (src / "journal.py").write_text(
        "def flush(self, storage, fs, name, data):\n"
        "    self.fs.pipe_file(name, data)\n"
        "    storage.fs.rm(name, recursive=True)\n"
        "    with fs.open(name, 'wb') as f:\n"
        "        f.write(data)\n"
        "    retry_call('write', name, lambda: fs.pipe_file(name, data))\n"  # a lambda: still a call
        "    fsu.call('list', name, fs.exists, name)\n"  # handed to a helper: fine
        "    with open(name, 'ab') as f:\n"
        "        f.write(data)\n"
        "    os.replace(name, name + '.old')\n"
    )
    problems, _ = scan(tmp_path)
    where = "packages/tune/src/lumos/tune/_internal/journal.py"
    assert problems == [
        f"{where}:2: self.fs.pipe_file(...)",
        f"{where}:3: storage.fs.rm(...)",
        f"{where}:4: fs.open(...)",
        f"{where}:6: fs.pipe_file(...)",
        f"{where}:8: open(...)",
        f"{where}:10: os.replace(...)",
    ]
