"""The ``lumos`` command (installed with lumos-storage) and its plugin interface.

Usage::

    lumos ls ~/lumos_results                   # runs and sweeps: state, start time, best metric
    lumos show ~/lumos_results/run-42          # config, attempts, failures, checkpoints, metrics
    lumos show s3://bucket/sweeps/sweep-7 --json
    lumos dashboard ~/lumos_results            # web UI of every run and sweep on 127.0.0.1:8080
    lumos dashboard ~/lumos_results/sweep-7 --optuna   # the sweep's study in optuna-dashboard
    lumos migrate train.py scripts/            # Ray Train / Tune code -> lumos (--dry-run: a diff)

Train runs are read here. Sweeps are read by lumos-tune's :class:`CliPlugin`, found
through the ``lumos.cli`` entry point group (``pip install lumos-tune``).

Example:
    >>> from typer.testing import CliRunner
    >>> from lumos.storage.cli import app
    >>> CliRunner().invoke(app, ["ls", "/no/such/dir"]).exit_code
    2
"""

from __future__ import annotations

from lumos.storage._internal.cli import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
    EXIT_ERROR as EXIT_ERROR,
    EXIT_USAGE as EXIT_USAGE,
    CliError as CliError,
    CliPlugin as CliPlugin,
    DashboardOptions as DashboardOptions,
    PluginMissingError as PluginMissingError,
    app as app,
    main as main,
    plugin_for as plugin_for,
    print_json as print_json,
)
from lumos.storage._internal.cli_messages import (
    fmt_best as fmt_best,
    fmt_value as fmt_value,
)
from lumos.storage._internal.run_view import (
    KNOWN_OWNERS as KNOWN_OWNERS,
    NotARunError as NotARunError,
    StoredRun as StoredRun,
    best_of as best_of,
    describe_run as describe_run,
    is_number as is_number,
    iso_time as iso_time,
    nested_runs as nested_runs,
    open_run as open_run,
    summarize_run as summarize_run,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "KNOWN_OWNERS",
    "CliError",
    "CliPlugin",
    "DashboardOptions",
    "NotARunError",
    "PluginMissingError",
    "StoredRun",
    "app",
    "best_of",
    "describe_run",
    "fmt_best",
    "fmt_value",
    "iso_time",
    "is_number",
    "main",
    "nested_runs",
    "open_run",
    "plugin_for",
    "print_json",
    "summarize_run",
]
