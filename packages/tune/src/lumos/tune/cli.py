"""Sweeps in the ``lumos`` command: ``lumos ls``, ``lumos show <sweep>``, ``lumos dashboard``.

The command itself comes with lumos-storage (``lumos.storage.cli``); this module is
its plugin for Tune experiments, registered in lumos-tune's ``pyproject.toml``::

    [project.entry-points."lumos.cli"]
    tune = "lumos.tune.cli:plugin"

Example:
    .. code-block:: console

        $ lumos show ~/lumos_results/sweep-7          # the live table, best trial, counts
        $ lumos show ~/lumos_results/sweep-7 --json
        $ lumos dashboard ~/lumos_results/sweep-7 --optuna  # optuna-dashboard on 127.0.0.1:8080
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from rich.console import Console

from lumos.storage.cli import (
    CliError,
    CliPlugin,
    DashboardOptions,
    StoredRun,
    fmt_best,
    iso_time,
)
from lumos.tune._internal import messages

if TYPE_CHECKING:
    from lumos.tune._internal.sweep_view import SweepView

__all__ = ["SweepPlugin", "plugin"]


def _trial_dict(trial: Any) -> dict[str, Any]:
    error = trial.error
    return {
        "name": trial.trial_name,
        "number": trial.number,
        "status": trial.status.value,
        "config": dict(trial.config),
        "iteration": trial.iteration,
        "last_result": dict(trial.last_result),
        "attempts": trial.attempt + 1,
        "errors": len(trial.errors),
        "error": None
        if error is None
        else {"type": error.exc_type, "message": error.error_message, "attempt": error.attempt},
        "checkpoint": trial.checkpoint_dir,
        "path": trial.path,
        "started_at": iso_time(trial.start_time or None),
        "ended_at": iso_time(trial.end_time or None),
    }


def _load(run: StoredRun) -> SweepView:
    """The stored sweep; an experiment with no readable study is a :class:`CliError`."""
    from lumos.tune._internal.errors import TuneError
    from lumos.tune._internal.sweep_view import load_sweep

    try:
        return load_sweep(run.storage)
    except TuneError as exc:
        raise CliError(f"cannot read the sweep: {exc}") from exc


class SweepPlugin(CliPlugin):
    """Reads lumos-tune experiments for the ``lumos`` command (read-only)."""

    kind = "sweep"

    def summarize(self, run: StoredRun, metric: str | None, mode: str | None) -> dict[str, Any]:
        """One ``lumos ls`` row: state, start time, trial counts and the best trial."""
        view = _load(run)
        if metric is not None and mode is None and metric not in view.metrics:
            mode = "min"
        best = view.best(metric, mode)
        best_metric = metric or (view.metrics[0] if len(view.metrics) == 1 else None)
        best_mode = mode or (view.modes[0] if len(view.modes) == 1 else None)
        state = run.state
        return {
            "name": state.name,
            "path": run.storage.uri,
            "kind": self.kind,
            "status": state.status,
            "started_at": iso_time(state.created_at),
            "updated_at": iso_time(state.updated_at),
            "trials": len(view.trials),
            "counts": view.counts(),
            "best": None
            if best is None or best_metric is None
            else {
                "metric": best_metric,
                "value": best.last_result.get(best_metric),
                "mode": best_mode,
                "trial": best.trial_name,
            },
        }

    def describe(self, run: StoredRun) -> dict[str, Any]:
        """The sweep: its trials (as the live table shows them), best trial and counts."""
        view = _load(run)
        counts = view.counts()
        best = view.best()
        state = run.state
        return {
            "name": state.name,
            "path": run.storage.uri,
            "kind": self.kind,
            "status": state.status,
            "created_at": iso_time(state.created_at),
            "updated_at": iso_time(state.updated_at),
            "metric": view.metrics,
            "mode": view.modes,
            "num_trials": len(view.trials),
            "counts": counts,
            "num_terminated": counts.get("TERMINATED", 0),
            "num_pruned": counts.get("PRUNED", 0),
            "num_errors": counts.get("ERROR", 0),
            "waiting": view.waiting,
            "best_trial": None if best is None else _trial_dict(best),
            "trials": [_trial_dict(t) for t in view.trials],
        }

    def render(self, detail: dict[str, Any], console: Console) -> None:
        """The live table of a running sweep (``progress.ConsoleReporter``), then the errors."""
        from lumos.tune._internal.live_trial import LiveTrial
        from lumos.tune._internal.progress import ConsoleReporter
        from lumos.tune._internal.trial import TrialStatus

        trials = []
        for t in detail["trials"]:
            trial = LiveTrial(t["number"], t["config"], t["config"], t["path"])
            trial.trial_name = t["name"]
            trial.status = TrialStatus(t["status"])
            trial.last_result = t["last_result"]
            trial.iteration = t["iteration"]
            trials.append(trial)
        reporter = ConsoleReporter(detail["metric"], verbose=0, file=io.StringIO())
        reporter.set_mode(detail["mode"][0] if detail["mode"] else None)
        table = reporter.table(trials)
        title = messages.sweep_title(
            detail["name"], detail["status"], detail["num_trials"], detail["counts"]
        )
        best = detail["best_trial"]
        if best is not None and detail["metric"]:
            metric = detail["metric"][0]
            summary = {"metric": metric, "value": best["last_result"].get(metric)}
            title += f" | best {best['name']} {fmt_best(summary)}"
        table.title = title
        console.print(table)
        console.print(
            messages.sweep_summary(
                detail["num_pruned"], detail["num_errors"], detail["waiting"], detail["path"]
            ),
            markup=False,
        )
        for t in detail["trials"]:
            if t["error"] is not None:
                err = t["error"]
                line = messages.trial_error_line(
                    t["name"], err["attempt"], err["type"], err["message"]
                )
                console.print(line, markup=False)

    def dashboard(self, run: StoredRun, options: DashboardOptions) -> int:
        """Copy the study into one local journal file and serve it with optuna-dashboard.

        The copy (``tune.export_study_journal``) is what optuna-dashboard reads, so the
        sweep's own journal is never opened for writing, on any storage.
        """
        from lumos.tune._internal.experiment import study_journal_path
        from lumos.tune._internal.journal import FsJournal, export_study_journal

        journal = FsJournal(run.storage.fs, study_journal_path(run.storage), writable=False)
        if not journal.exists():
            raise CliError(f"{run.storage.uri!r} has no study journal yet", exit_code=2)
        temp_dir = None if options.journal_file else tempfile.mkdtemp(prefix="lumos-dashboard-")
        local = options.journal_file or os.path.join(temp_dir or "", f"{run.state.name}.journal")
        export_study_journal(journal, os.path.expanduser(local))
        command = [
            "optuna-dashboard",
            local,
            "--host",
            options.host,
            "--port",
            str(options.port),
        ]
        console = Console(soft_wrap=True, highlight=False)
        if options.print_command:
            console.print(shlex.join(command), markup=False)
            return 0
        try:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend
            from optuna_dashboard import run_server
        except ImportError as exc:
            raise CliError(
                "lumos dashboard needs optuna-dashboard: pip install 'lumos-tune[dashboard]' "
                f"(the study is ready at {local}: `{shlex.join(command)}`)"
            ) from exc
        console.print(
            messages.dashboard_serving(run.storage.uri, options.host, options.port, local),
            markup=False,
        )
        try:
            run_server(
                JournalStorage(JournalFileBackend(local)), host=options.host, port=options.port
            )
        except KeyboardInterrupt:
            pass
        finally:
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
        return 0


plugin = SweepPlugin()
"""The instance the ``lumos.cli`` entry point names."""
