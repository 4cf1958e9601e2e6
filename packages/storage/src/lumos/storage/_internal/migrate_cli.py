"""``lumos migrate PATH...``: rewrite scripts from Ray Train / Tune to lumos, in place.

The files, the diff and the console lines (the typer command and its exit code are in
``cli.py``); the rewrite of one source is
:func:`lumos.storage._internal.migrate.migrate_source` (libcst, loaded on first use so
``lumos ls`` does not pay for it).

A file that cannot be read or parsed is skipped with a message and the others are
migrated; a path that does not exist stops everything before any file is written.
"""

from __future__ import annotations

import difflib
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lumos.storage._internal.migrate import Migration


def python_files(path: Path) -> list[Path]:
    """``path`` itself if it is a file, else the ``*.py`` files under it (recursively,
    sorted; folders whose name starts with ``.`` and ``__pycache__`` are skipped)."""
    if not path.is_dir():
        return [path]
    found = []
    for file in sorted(path.rglob("*.py")):
        parts = file.relative_to(path).parts
        if file.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in parts):
            found.append(file)
    return found


@dataclass(frozen=True)
class FileResult:
    """One file after ``lumos migrate``.

    Attributes:
        path: The file.
        migration: The rewrite (None when the file could not be read or parsed).
        error: Why the file was skipped, or None.
        diff: The unified diff (empty when unchanged).
    """

    path: Path
    migration: Migration | None
    error: str | None = None
    diff: str = ""


def migrate_file(path: Path, write: bool) -> FileResult:
    """Rewrite one file (in place when ``write``); its encoding and line endings are kept.

    A file that cannot be read, decoded or parsed is not an exception: the result says why.
    """
    import libcst

    from lumos.storage._internal.migrate import migrate_source

    try:
        raw = path.read_bytes()
        encoding = tokenize.detect_encoding(io.BytesIO(raw).readline)[0]
        source = raw.decode(encoding)
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        return FileResult(path, None, f"cannot read it ({exc})")
    try:
        migration = migrate_source(source)
    except libcst.ParserSyntaxError as exc:
        message = str(exc).strip().splitlines()[0]
        return FileResult(path, None, f"line {exc.editor_line}: not valid Python ({message})")
    if not migration.changed:
        return FileResult(path, migration)
    diff = unified_diff(path, source, migration.code)
    if write:
        try:
            path.write_bytes(migration.code.encode(encoding))
        except OSError as exc:
            return FileResult(path, None, f"cannot write it ({exc})")
    return FileResult(path, migration, diff=diff)


def unified_diff(path: Path, before: str, after: str) -> str:
    """The ``a/PATH`` -> ``b/PATH`` unified diff (``patch -p1`` applies it)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(s if s.endswith("\n") else s + "\n\\ No newline at end of file\n" for s in lines)


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


def _report(result: FileResult, dry_run: bool) -> None:
    """A file's lines: the diff or ``rewrote``, its warnings, or why it was skipped."""
    if result.error is not None:
        _err(f"error: {result.path}: {result.error}; skipped")
        return
    migration = result.migration
    assert migration is not None
    if migration.changed:
        if dry_run:
            sys.stdout.write(result.diff)
        else:
            sys.stdout.write(f"rewrote {result.path}: {_plural(migration.rewrites, 'rewrite')}\n")
    for warning in migration.warnings:
        _err(f"{result.path}:{warning.line}: warning: {warning.message}")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _summary(results: list[FileResult], dry_run: bool) -> str:
    done = [r.migration for r in results if r.migration is not None]
    changed = [m for m in done if m.changed]
    verb = "would change" if dry_run else "changed"
    line = (
        f"{verb} {_plural(len(changed), 'file')} of {len(results)} "
        f"({_plural(sum(m.rewrites for m in changed), 'rewrite')}, "
        f"{_plural(sum(len(m.warnings) for m in done), 'warning')})"
    )
    skipped = len(results) - len(done)
    return line + (f"; {_plural(skipped, 'file')} skipped" if skipped else "")


@dataclass(frozen=True)
class MigrateRun:
    """What ``lumos migrate`` did.

    Attributes:
        missing: Paths that do not exist (then nothing was migrated).
        results: One per file, in order.
    """

    missing: list[Path]
    results: list[FileResult]

    @property
    def failed(self) -> bool:
        """A file could not be read, parsed or written (it was skipped)."""
        return any(r.error is not None for r in self.results)


def migrate_paths(paths: list[Path], dry_run: bool) -> MigrateRun:
    """Migrate every file of ``paths``, printing as ``lumos migrate`` does.

    Args:
        paths: Files, or folders searched for ``*.py`` (see :func:`python_files`).
        dry_run: Print a unified diff of each file that would change; write nothing.
    """
    missing = [p for p in paths if not p.exists()]
    for path in missing:
        _err(f"error: {path}: no such file or folder")
    if missing:
        return MigrateRun(missing, [])
    results: list[FileResult] = []
    for path in paths:
        files = python_files(path)
        if not files:
            _err(f"{path}: no *.py files under it")
        for file in files:
            results.append(migrate_file(file, write=not dry_run))
            _report(results[-1], dry_run)
    summary = _summary(results, dry_run)
    if dry_run:
        _err(summary)  # stdout holds only the diff
    else:
        sys.stdout.write(summary + "\n")
    return MigrateRun([], results)
