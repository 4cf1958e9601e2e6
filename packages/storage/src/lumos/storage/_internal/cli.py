"""The ``lumos`` command: ``ls``, ``show`` and ``dashboard`` over stored runs, and
``migrate`` (Ray Train / Tune scripts to lumos: ``migrate_cli.py``).

lumos-storage owns the command and the runs it knows (Train runs: any run state).
A package that stores its own kind of run (lumos-tune: sweeps) registers a
:class:`CliPlugin` in the ``lumos.cli`` entry point group, under the key its runs
carry in ``RunState.extra``; the command loads it by name only when it meets such
a run, so this module never imports that package.

Exit codes: 0 done, 1 an error while reading (corrupt state, missing backend or
plugin), 2 a usage error (a path that is not a lumos run, a bad option).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from lumos.storage._internal import cli_messages as messages, dashboard_server, run_view
from lumos.storage._internal.cli_messages import fmt_best, fmt_value
from lumos.storage._internal.cli_plugins import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
    EXIT_ERROR as EXIT_ERROR,
    EXIT_USAGE as EXIT_USAGE,
    CliError as CliError,
    CliPlugin as CliPlugin,
    DashboardOptions as DashboardOptions,
    PluginMissingError as PluginMissingError,
    plugin_for as plugin_for,
    summary_row,
)
from lumos.storage._internal.errors import MissingBackendError, StorageError, StorageUsageError
from lumos.storage._internal.jsonable import json_default
from lumos.storage._internal.migrate_cli import migrate_paths
from lumos.storage._internal.run_view import NotARunError

# -- output -------------------------------------------------------------------------------


def _stdout() -> Console:
    return Console(file=sys.stdout, soft_wrap=True, highlight=False)


def _stderr() -> Console:
    return Console(file=sys.stderr, soft_wrap=True, highlight=False)


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout (what ``--json`` prints)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=json_default) + "\n")
    sys.stdout.flush()


@contextmanager
def _errors() -> Iterator[None]:
    """Turn lumos errors into a message on stderr and the exit code."""
    try:
        yield
    except CliError as exc:
        _stderr().print(messages.error_line(exc), markup=False)
        raise typer.Exit(exc.exit_code) from exc
    except (NotARunError, StorageUsageError) as exc:
        _stderr().print(messages.error_line(exc), markup=False)
        raise typer.Exit(EXIT_USAGE) from exc
    except (MissingBackendError, StorageError) as exc:
        _stderr().print(messages.error_line(exc), markup=False)
        raise typer.Exit(EXIT_ERROR) from exc


def _row(table: Table, *cells: str) -> None:
    """Add a row of plain text: a cell is never read as rich markup (errors hold ``[...]``)."""
    table.add_row(*(Text(c) for c in cells))


def _render_run(detail: dict[str, Any], console: Console) -> None:
    header = Text(detail["name"], style="bold")
    header.append(messages.run_heading(detail), style="")
    console.print(header)
    console.print(messages.run_counts(detail), markup=False)
    if detail["config"]:
        console.print("config: " + json.dumps(detail["config"], default=json_default), markup=False)
    attempts = Table(title="attempts", title_justify="left")
    for col in ("#", "status", "started", "ended", "error"):
        attempts.add_column(col)
    for a in detail["attempts"]:
        _row(
            attempts,
            str(a["index"]),
            a["status"],
            a["started_at"] or "",
            a["ended_at"] or "",
            a["error"] or "",
        )
    console.print(attempts)
    checkpoints = Table(title="checkpoints", title_justify="left")
    keys: list[str] = []
    for c in detail["checkpoints"]:
        keys += [k for k, v in c["metrics"].items() if k not in keys and run_view.is_number(v)]
    keys = keys[:5]
    for col in ("checkpoint", "report", "status", *keys):
        checkpoints.add_column(Text(col))
    for c in detail["checkpoints"]:
        name = c["dir_name"] + (" (latest)" if c["latest"] else "")
        cells = [fmt_value(c["metrics"].get(k, "")) for k in keys]
        _row(checkpoints, name, str(c["report_index"]), messages.checkpoint_status(c), *cells)
    console.print(checkpoints)
    for r in detail["rollbacks"]:
        console.print(messages.rollback_line(r), markup=False)
    if detail["latest_metrics"]:
        console.print(messages.latest_metrics(detail), markup=False)
    if detail["nested_runs"]:
        console.print("nested runs: " + ", ".join(detail["nested_runs"]), markup=False)


# -- commands -----------------------------------------------------------------------------

app = typer.Typer(
    name="lumos",
    help="Look at lumos runs (Train) and sweeps (Tune) in any storage path, local or s3://; "
    "migrate scripts from Ray Train / Ray Tune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
"""The ``lumos`` command (a Typer app: ``ls``, ``show``, ``dashboard``, ``migrate``)."""

EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="S3-compatible endpoint for s3:// paths (default: AWS_ENDPOINT_URL / AWS config).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@app.command("ls")
def ls_command(
    path: Annotated[str, typer.Argument(help="A storage path, or one run's directory.")],
    metric: Annotated[
        str | None,
        typer.Option(help="Rank runs by this metric (sweeps: default their own metric)."),
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="min or max (default min; sweeps: their own).")
    ] = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the runs and sweeps under PATH: name, kind, state, start time, best metric."""
    with _errors():
        if mode is not None and mode not in ("min", "max"):
            raise StorageUsageError(f"--mode={mode!r} is not allowed: use min or max")
        fs, paths = run_view.find_runs(path, endpoint_url)
        rows: list[dict[str, Any]] = []
        for run_path in paths:
            rows.append(summary_row(fs, run_path, metric, mode))
    if as_json:
        print_json(rows)
        return
    if not rows:
        _stderr().print(messages.no_runs(path), markup=False)
        return
    table = Table()
    for col in ("name", "kind", "state", "started", "best"):
        table.add_column(col)
    for row in rows:
        _row(
            table,
            row["name"],
            row["kind"],
            row["status"],
            row.get("started_at") or "",
            fmt_best(row.get("best")) or row.get("note", ""),
        )
    _stdout().print(table)


@app.command("show")
def show_command(
    run: Annotated[str, typer.Argument(help="A run's or sweep's directory.")],
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a run (config, attempts and failures, checkpoints, latest metrics) or a sweep."""
    with _errors():
        stored = run_view.open_run(run, endpoint_url)
        plugin = plugin_for(stored)
        detail = run_view.describe_run(stored) if plugin is None else plugin.describe(stored)
    if as_json:
        print_json(detail)
    elif plugin is None:
        _render_run(detail, _stdout())
    else:
        plugin.render(detail, _stdout())


@app.command("dashboard")
def dashboard_command(
    path: Annotated[str, typer.Argument(help="A storage path, a run or a sweep (any fsspec URL).")],
    host: Annotated[str, typer.Option(help="Interface to serve on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8080,
    optuna: Annotated[
        bool,
        typer.Option("--optuna", help="Open a sweep's study in optuna-dashboard instead."),
    ] = False,
    journal_file: Annotated[
        str | None,
        typer.Option(help="--optuna: where to write the local copy of the study (default: temp)."),
    ] = None,
    print_command: Annotated[
        bool,
        typer.Option(help="--optuna: write the study file and print the command only."),
    ] = False,
    endpoint_url: EndpointOption = None,
) -> None:
    """Serve a read-only web dashboard of PATH's runs and sweeps on http://HOST:PORT/.

    With --optuna (implied by --journal-file / --print-command), open a sweep's Optuna
    study in optuna-dashboard instead (needs lumos-tune and optuna-dashboard).
    """
    with _errors():
        if not 0 < port < 65536:
            raise StorageUsageError(f"--port={port} is not allowed: use 1..65535")
        if not (optuna or journal_file or print_command):
            code = dashboard_server.serve(path, host, port, endpoint_url)
        else:
            code = _optuna_dashboard(
                path, DashboardOptions(host, port, journal_file, print_command), endpoint_url
            )
    if code:
        raise typer.Exit(code)


def _optuna_dashboard(path: str, options: DashboardOptions, endpoint_url: str | None) -> int:
    stored = run_view.open_run(path, endpoint_url)
    plugin = plugin_for(stored)
    if plugin is None:
        raise StorageUsageError(
            f"{stored.storage.uri!r} is a Train run: `lumos dashboard --optuna` opens lumos-tune "
            "sweeps only (`lumos dashboard` without --optuna shows a run)"
        )
    return plugin.dashboard(stored, options)


@app.command("migrate")
def migrate_command(
    paths: Annotated[
        list[Path],
        typer.Argument(
            metavar="PATH", help="Python files, or folders to search for *.py (recursively)."
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print a unified diff and write nothing.")
    ] = False,
) -> None:
    """Rewrite Ray Train / Ray Tune imports and calls to lumos, in place.

    Comments and formatting stay. Names lumos lacks are left alone, with a warning
    naming the file and line. Exit code 1 when a file could not be parsed (skipped).
    """
    run = migrate_paths(paths, dry_run)
    if run.missing:
        raise typer.Exit(EXIT_USAGE)
    if run.failed:
        raise typer.Exit(EXIT_ERROR)


def main() -> None:
    """The ``lumos`` console script."""
    app()
