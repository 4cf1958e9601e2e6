"""Console progress: a live rich table on a terminal, plain lines elsewhere.

The controller calls :meth:`ConsoleReporter.update` every loop iteration; the
reporter redraws at most every ``refresh_s`` seconds (nothing is rendered per
report). ``verbose=0`` uses no reporter at all.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lumos.tune._internal import messages
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.metrics import flatten
from lumos.tune._internal.trial import TrialStatus

_MAX_ROWS = 20
_MAX_CONFIG_COLS = 6
_MAX_METRIC_COLS = 4


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


class ConsoleReporter:
    """Shows the sweep's progress.

    Args:
        metrics: Metric names to show first (the optimized ones).
        verbose: 1 table / periodic status; 2 also one line per finished trial.
        refresh_s: Minimum seconds between redraws of the live table.
        plain_interval_s: Minimum seconds between status lines when not on a terminal.
        file: Stream to write to (default stdout).
        force_terminal: Override TTY detection (tests).
    """

    def __init__(
        self,
        metrics: list[str],
        verbose: int = 1,
        refresh_s: float = 2.0,
        plain_interval_s: float = 10.0,
        file: IO[str] | None = None,
        force_terminal: bool | None = None,
    ) -> None:
        self.metrics = list(metrics)
        self.verbose = verbose
        self.refresh_s = refresh_s
        self.file = file if file is not None else sys.stdout
        self.console = Console(file=self.file, force_terminal=force_terminal)
        self.live_mode = self.console.is_terminal
        self.interval_s = refresh_s if self.live_mode else max(refresh_s, plain_interval_s)
        self._live: Live | None = None
        self._last = -float("inf")
        self._start = time.monotonic()
        self._waiting_note = ""

    # -- ProgressSink ---------------------------------------------------------------------
    def update(self, trials: list[LiveTrial], *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        if self.live_mode:
            table = self.table(trials)
            if self._live is None:
                self._live = Live(table, console=self.console, auto_refresh=False, transient=False)
                self._live.start()
            self._live.update(table, refresh=True)
        else:
            self.console.print(
                self.status_line(trials), markup=False, highlight=False, soft_wrap=True
            )

    def trial_done(self, trial: LiveTrial) -> None:
        if self.verbose < 2:
            return
        result = ", ".join(
            f"{k}={_fmt(trial.last_result[k])}" for k in self.metrics if k in trial.last_result
        )
        line = f"{trial.trial_name} {trial.status.value}"
        if result:
            line += f" ({result})"
        if trial.error is not None:
            line += f": {trial.error.exc_type}: {trial.error.error_message}"
        self._print(line)

    def waiting_for_resources(self, trials: list[LiveTrial], resources: dict[str, float]) -> None:
        note = messages.waiting_for_resources([t.trial_name for t in trials], resources)
        self._waiting_note = note
        self._print(note)

    def close(self, trials: list[LiveTrial]) -> None:
        """Final redraw and stop the live display."""
        self.update(trials, force=True)
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- rendering ----------------------------------------------------------------------
    def _print(self, line: str) -> None:
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False)
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def status_line(self, trials: list[LiveTrial]) -> str:
        counts = Counter(_display_status(t) for t in trials)
        elapsed = time.monotonic() - self._start
        parts = [f"{n} {s}" for s, n in sorted(counts.items())]
        best = self._best(trials)
        line = f"[lumos.tune {elapsed:.0f}s] {len(trials)} trials: " + ", ".join(parts)
        if best is not None:
            line += f" | best {best}"
        return line

    def _best(self, trials: list[LiveTrial]) -> str | None:
        if not self.metrics:
            return None
        metric = self.metrics[0]
        scored = [
            (t.last_result[metric], t)
            for t in trials
            if t.status is TrialStatus.TERMINATED
            and isinstance(t.last_result.get(metric), (int, float))
        ]
        if not scored:
            return None
        value, trial = (
            min(scored, key=lambda p: p[0]) if self._minimize else max(scored, key=lambda p: p[0])
        )
        return f"{trial.trial_name} {metric}={_fmt(value)}"

    _minimize = True

    def set_mode(self, mode: str | None) -> None:
        """Which way 'best' points (first metric)."""
        self._minimize = mode != "max"

    def table(self, trials: list[LiveTrial]) -> Table:
        table = Table(title=self.status_line(trials), title_justify="left")
        config_keys: list[str] = []
        for t in trials[:50]:
            for key in flatten(t.config):
                if key not in config_keys:
                    config_keys.append(key)
        config_keys = config_keys[:_MAX_CONFIG_COLS]
        metric_keys = list(self.metrics)
        if not metric_keys:
            for t in trials:
                for key in t.last_result:
                    if key not in metric_keys and key != "training_iteration":
                        metric_keys.append(key)
                if len(metric_keys) >= _MAX_METRIC_COLS:
                    break
        table.add_column("trial")
        table.add_column("status")
        for key in config_keys:
            table.add_column(key)
        table.add_column("iter", justify="right")
        for key in metric_keys:
            table.add_column(key, justify="right")
        shown = [t for t in trials if t.status in (TrialStatus.RUNNING, TrialStatus.PENDING)]
        rest = [t for t in reversed(trials) if t not in shown]
        for t in (shown + rest)[:_MAX_ROWS]:
            flat = flatten(t.config)
            table.add_row(
                t.trial_name,
                _display_status(t),
                *(_fmt(flat.get(k, "")) for k in config_keys),
                str(t.iteration),
                *(_fmt(t.last_result.get(k, "")) for k in metric_keys),
            )
        if len(trials) > _MAX_ROWS:
            table.caption = f"{len(trials) - _MAX_ROWS} more trials not shown"
        if self._waiting_note and any(t.waiting_for_resources for t in trials):
            table.caption = (table.caption or "") + "  " + "trials wait for resources"
        return table


def _display_status(trial: LiveTrial) -> str:
    if trial.status is TrialStatus.RUNNING and trial.waiting_for_resources:
        return "PENDING (resources)"
    return trial.status.value
