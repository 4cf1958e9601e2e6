"""``lumos migrate`` as a library: rewrite Ray Train / Ray Tune code to lumos.

The ``lumos migrate PATH...`` command runs :func:`migrate_file` on each file;
:func:`migrate_source` rewrites one source text (libcst: comments and formatting stay).

Example:
    >>> from lumos.storage.migrate import migrate_source
    >>> done = migrate_source("from ray.tune.logger import JsonLoggerCallback\\n")
    >>> done.code, done.rewrites
    ('from lumos.tune.logger import JSONLoggerCallback\\n', 1)
"""

from __future__ import annotations

from lumos.storage._internal.migrate import (
    Migration as Migration,
    MigrationWarning as MigrationWarning,
    migrate_source as migrate_source,
)
from lumos.storage._internal.migrate_cli import (
    FileResult as FileResult,
    migrate_file as migrate_file,
    python_files as python_files,
)
from lumos.storage._internal.migrate_resolve import (
    Mapped as Mapped,
    lumos_targets as lumos_targets,
    missing_targets as missing_targets,
)

__all__ = [
    "FileResult",
    "Mapped",
    "Migration",
    "MigrationWarning",
    "lumos_targets",
    "migrate_file",
    "migrate_source",
    "missing_targets",
    "python_files",
]
