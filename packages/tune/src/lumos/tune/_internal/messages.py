"""Every line of text lumos.tune writes to the console or its log, in one place.

The driver's modules call these functions for what they print or log (the progress
display's table and status lines are in ``progress.py``); exceptions keep their own
messages. Each function returns the finished line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lumos.runtime import format_resources, user_resources

STOP_ALL = "the stopper's stop_all() is true; stopping running trials"
STATUS_NOT_RECORDED = "could not record the experiment status"


def waiting_for_resources(trial_names: Sequence[str], resources: Mapping[str, float]) -> str:
    """Trials whose actor Ray cannot place, each needing ``resources`` (only what a user
    asks for is named: never Ray's placement-group or node resources)."""
    return (
        f"{', '.join(trial_names)}: waiting for resources: each trial's actor needs "
        f"{format_resources(user_resources(resources))} and the cluster has no room for it now (running "
        "trials, or the Train workers they started, hold the rest). Lower "
        "TuneConfig(max_concurrent_trials=...) or trial_resources, or add nodes."
    )


def trial_retried(trial_name: str, reason: str, checkpoint_dir: str | None) -> str:
    """A failed trial goes back to the queue (``FailureConfig`` allows another attempt)."""
    return f"trial {trial_name}: {reason}; it resumes from {checkpoint_dir or 'the start'}"


def time_budget_spent(budget_s: float) -> str:
    """``TuneConfig(time_budget_s=...)`` ran out."""
    return f"time budget of {budget_s:.1f}s is spent; stopping running trials"


def fail_fast_stop(trial_name: str) -> str:
    """``FailureConfig(fail_fast=True)``: a trial failed, the sweep ends and returns."""
    return (
        f"trial {trial_name} failed and FailureConfig(fail_fast=True) ends the sweep: "
        "stopping running trials; fit() returns the ResultGrid with the error "
        "(fail_fast='raise' raises it instead)"
    )


def resuming(uri: str, finished: int, to_resume: int) -> str:
    """``Tuner.restore(...).fit()`` goes on with an experiment."""
    return f"Resuming experiment {uri}: {finished} finished trial(s) kept, {to_resume} to resume"


def unreadable_trial_state(trial_name: str) -> str:
    """A restored trial's stored state cannot be read: it starts over."""
    return f"trial {trial_name}: unreadable state, restarting it"


def unreadable_tuner_state(path: str) -> str:
    """The stored param_space / tune_config cannot be read back on restore."""
    return f"could not read {path}; give param_space and tune_config"


def pbt_no_checkpoint(donor_name: str, trial_name: str) -> str:
    """Population-based training: the donor has nothing to clone."""
    return (
        f"pbt: trial {donor_name} has no committed checkpoint; trial {trial_name} goes on unchanged"
    )


def pbt_cloned(
    trial_name: str, donor_name: str, step: int, reason: str, new_config: Mapping[str, Any]
) -> str:
    """Population-based training cloned ``donor_name`` into ``trial_name``."""
    return (
        f"pbt: trial {trial_name} cloned trial {donor_name} at step {step} ({reason}); "
        f"new config {new_config}"
    )


def sweep_summary(num_pruned: int, num_errors: int, waiting: int, path: str) -> str:
    """``lumos show``'s line under a sweep's table."""
    return f"{num_pruned} pruned, {num_errors} errored, {waiting} enqueued not started  ({path})"


def trial_error_line(name: str, attempt: int, exc_type: str, message: str) -> str:
    """``lumos show``'s line for a trial that failed."""
    return f"{name} ERROR (attempt {attempt}): {exc_type}: {message}"


def dashboard_serving(uri: str, host: str, port: int, journal_file: str) -> str:
    """``lumos dashboard`` serves a sweep's study."""
    return (
        f"optuna-dashboard for {uri} on http://{host}:{port}/ "
        f"(study copied to {journal_file}; Ctrl-C stops it)"
    )


def sweep_title(name: str, status: str, num_trials: int, counts: Mapping[str, int]) -> str:
    """``lumos show``'s title over a sweep's table (trial counts by status)."""
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return f"{name} ({status}): {num_trials} trials: {by_status}"
