"""The ``lumos`` command's plugin interface and the one row of ``lumos ls`` per run.

lumos-storage owns the command and the runs it knows (Train runs: any run state).
A package that stores its own kind of run (lumos-tune: sweeps) registers a
:class:`CliPlugin` in the ``lumos.cli`` entry point group, under the key its runs
carry in ``RunState.extra``; :func:`plugin_for` loads it by name only when it meets
such a run, so lumos-storage never imports that package. ``cli.py`` (the commands)
and ``dashboard_*.py`` (the web dashboard) read runs through this module.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from rich.console import Console

from lumos.storage._internal import run_view
from lumos.storage._internal.errors import StorageError, StorageUsageError
from lumos.storage._internal.run_view import KNOWN_OWNERS, StoredRun

ENTRY_POINT_GROUP = "lumos.cli"
"""The entry point group where packages register their :class:`CliPlugin`."""

EXIT_ERROR = 1
"""Exit code of an error while reading (corrupt state, missing backend or plugin)."""

EXIT_USAGE = 2
"""Exit code of a usage error (a path that is not a lumos run, a bad option)."""


class CliError(StorageError):
    """An error the ``lumos`` command reports as one line on stderr, with ``exit_code``.

    Plugins raise it (or a subclass) for what the user can fix.

    Args:
        message: What went wrong and the way out.
        exit_code: 1 (default) for an error while reading, 2 for a usage error.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.exit_code))


class PluginMissingError(CliError):
    """A run was written by a package whose ``lumos`` plugin is not installed."""


@dataclass(frozen=True)
class DashboardOptions:
    """What ``lumos dashboard`` was asked for.

    Attributes:
        host: Interface to serve on (default ``127.0.0.1``: this machine only).
        port: TCP port to serve on.
        journal_file: Where to write the local copy of the study (None: a temporary file).
        print_command: Only write the file and print the command that serves it.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    journal_file: str | None = None
    print_command: bool = False


class CliPlugin(abc.ABC):
    """What a package adds to the ``lumos`` command for the runs it stores.

    Register an instance in the ``lumos.cli`` entry point group under the key the
    package's runs carry in ``RunState.extra`` (lumos-tune: ``tune``)::

        [project.entry-points."lumos.cli"]
        tune = "lumos.tune.cli:plugin"

    Summaries and descriptions are JSON-able dicts: ``--json`` prints them as they are.

    Attributes:
        kind: What ``lumos ls`` calls these runs (``"sweep"``).
    """

    kind: str = "run"

    @abc.abstractmethod
    def summarize(self, run: StoredRun, metric: str | None, mode: str | None) -> dict[str, Any]:
        """One ``lumos ls`` row: the keys of :func:`summarize_run` (``best`` may be None).

        Args:
            run: The stored run.
            metric: The ``--metric`` asked for (None: the run's own).
            mode: ``min``/``max`` asked for (None: the run's own).
        """

    @abc.abstractmethod
    def describe(self, run: StoredRun) -> dict[str, Any]:
        """Everything ``lumos show`` tells about the run."""

    @abc.abstractmethod
    def render(self, detail: dict[str, Any], console: Console) -> None:
        """Print :meth:`describe`'s dict for people."""

    def dashboard(self, run: StoredRun, options: DashboardOptions) -> int:
        """Serve the run in a dashboard until interrupted; return the exit code.

        Raises:
            StorageUsageError: This kind of run has no dashboard (the default).
        """
        raise StorageUsageError(
            f"{run.storage.uri!r} is a {self.kind}: `lumos dashboard --optuna` opens lumos-tune sweeps only"
        )


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def plugin_for(
    run: StoredRun, installed: Mapping[str, EntryPoint] | None = None
) -> CliPlugin | None:
    """The installed plugin that reads ``run``, None for a plain (Train) run.

    Args:
        run: The stored run.
        installed: The ``lumos.cli`` entry points to choose from (default: those of
            the installed distributions).

    Raises:
        PluginMissingError: The run was written by a package that is not installed.
    """
    owner = run.owner
    if owner is None:
        return None
    ep = (_entry_points() if installed is None else installed).get(owner)
    if ep is None:
        kind, package = KNOWN_OWNERS[owner]
        raise PluginMissingError(
            f"{run.storage.uri!r} is a {package} {kind}: pip install {package} to read it"
        )
    plugin = ep.load()
    if not isinstance(plugin, CliPlugin):
        raise PluginMissingError(
            f"the {ENTRY_POINT_GROUP!r} entry point {ep.name!r} = {ep.value!r} is not a "
            f"lumos.storage.cli.CliPlugin instance (got {type(plugin).__name__})"
        )
    return plugin


def summary_row(fs: Any, run_path: str, metric: str | None, mode: str | None) -> dict[str, Any]:
    """One ``lumos ls`` row (and dashboard row) of the run at ``run_path``.

    An unreadable run is a row saying why, not the end of the listing.
    """
    try:
        run = run_view.load_run(fs, run_path)
        plugin = plugin_for(run)
        if plugin is not None:
            return plugin.summarize(run, metric, mode)
        return run_view.summarize_run(run, metric, mode or "min")
    except PluginMissingError as exc:
        owner = run.owner or ""
        row = run_view.summarize_run(run, None, "min", kind=KNOWN_OWNERS[owner][0])
        return {**row, "best": None, "note": str(exc).split(": ", 1)[-1]}
    except Exception as exc:  # one unreadable run must not end the listing
        name = run_path.rstrip("/").rsplit("/", 1)[-1]
        return {
            "name": name,
            "path": run_path,
            "kind": "?",
            "status": "unreadable",
            "started_at": None,
            "best": None,
            "note": str(exc),
        }
