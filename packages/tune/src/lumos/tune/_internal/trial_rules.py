"""The per-trial decisions of the controller: prune / stop after a report, retry after an error.

Each rule reads a trial and returns a decision; the controller executes it. The only
side effect is ``StopRules`` handing the reported value to the trial's Optuna pruner
(``optuna.Trial.report``), which the pruner's decision needs.
"""

from __future__ import annotations

import optuna

from lumos.runtime import (
    DefaultFailurePolicy,
    FailureDecision,
    FailureKind,
    FailurePolicy,
    WorkerFailure,
)
from lumos.storage import validate_name
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.controller_api import PRUNE, STOP
from lumos.tune._internal.errors import (
    MetricNotReportedError,
    TrialError,
    TrialErrorRecord,
    TuneConfigError,
    TuneFailedError,
)
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.metrics import finite_or_none
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.stoppers import Stopper
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import NameRecord

_LOST_KINDS = {"WorkerDied": FailureKind.ACTOR_DIED, "WorkerHung": FailureKind.HUNG}


class StopRules:
    """After a report: should the trial be pruned (Optuna pruner) or stopped (``stop``)?

    Args:
        tune_config: The pruner, the metric and the stop criteria.
    """

    def __init__(self, tune_config: TuneConfig) -> None:
        metrics = tune_config.metrics
        self.metric = metrics[0] if len(metrics) == 1 else None
        self.metrics = list(metrics)
        pruner = tune_config.pruner
        self.pruning = pruner is not None and not isinstance(pruner, optuna.pruners.NopPruner)
        stop = tune_config.stop
        self.stop_dict = stop if isinstance(stop, dict) else None
        self.stop_fn = stop if callable(stop) else None
        self.stopper = stop if isinstance(stop, Stopper) else None

    @property
    def judges_reports(self) -> bool:
        """Whether the driver judges each report (a pruner, a stopper object or function):
        then trials wait for the verdict on a report before their next one."""
        return self.pruning or self.stop_fn is not None

    def stop_all(self) -> bool:
        """Whether a stopper object ends the whole sweep (``Stopper.stop_all()``)."""
        return self.stopper is not None and self.stopper.stop_all()

    def after_report(
        self, trial: LiveTrial, iteration: int, metrics: dict[str, object]
    ) -> str | None:
        """``PRUNE``, ``STOP`` or None; feeds the metric to the trial's pruner."""
        if self.pruning and self.metric is not None and trial.optuna_trial is not None:
            value = finite_or_none(metrics.get(self.metric))
            if value is not None:
                if iteration > trial.max_step_reported:
                    trial.optuna_trial.report(value, iteration)
                    trial.max_step_reported = iteration
                if trial.optuna_trial.should_prune():
                    return PRUNE
        if self._should_stop(trial, metrics):
            return STOP
        return None

    def missing_metric(self, trial: LiveTrial) -> MetricNotReportedError | None:
        """The error for a finished trial that never reported an optimized metric."""
        seen = trial.seen_metrics
        if self.metric is not None and self.metric not in seen:
            reported = sorted(k for k in seen if k != ITERATION_KEY)
            return MetricNotReportedError(self.metric, trial.trial_name, reported)
        for name in self.metrics:
            if name not in seen:
                return MetricNotReportedError(name, trial.trial_name, sorted(seen))
        return None

    def _should_stop(self, trial: LiveTrial, metrics: dict[str, object]) -> bool:
        if self.stop_dict is not None:
            for key, bound in self.stop_dict.items():
                value = finite_or_none(_bool_as_number(metrics.get(key)))
                if value is not None and value >= bound:
                    return True
        if self.stop_fn is not None:
            return bool(self.stop_fn(trial.trial_id, metrics))
        return False


class TrialNames:
    """Names new trials with ``TuneConfig(trial_name_creator=, trial_dirname_creator=)``.

    Args:
        tune_config: The creators (functions of the frozen :class:`Trial`).
        taken: Directory names already used in the experiment.
    """

    def __init__(self, tune_config: TuneConfig, taken: set[str]) -> None:
        self.name_creator = tune_config.trial_name_creator
        self.dirname_creator = tune_config.trial_dirname_creator
        self.taken = set(taken)

    def name(self, trial: LiveTrial) -> NameRecord | None:
        """Name ``trial`` (in place); the record to journal, or None for default names."""
        if self.name_creator is None and self.dirname_creator is None:
            return None
        snapshot = trial.snapshot()
        if self.name_creator is not None:
            trial.trial_name = _created("trial_name_creator", self.name_creator(snapshot))
        if self.dirname_creator is not None:
            dir_name = _created("trial_dirname_creator", self.dirname_creator(snapshot))
            trial.dir_name = validate_name(dir_name, "trial_dirname_creator(trial)")
        if trial.dir_name in self.taken:
            trial.dir_name = f"{trial.dir_name}_{trial.trial_id}"  # keep directories apart
        self.taken.add(trial.dir_name)
        return NameRecord(trial.number, trial.trial_name, trial.dir_name)


def _created(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TuneConfigError(f"TuneConfig({what}=...) must return a non-empty str, got {value!r}")
    return value


def _bool_as_number(value: object) -> object:
    """Ray's ``stop={"done": True}``: a reported bool counts as 0 or 1."""
    return int(value) if isinstance(value, bool) else value


def fail_fast_error(
    trial: LiveTrial, decision: FailureDecision, trials: list[LiveTrial]
) -> TuneFailedError:
    """The error ``FailureConfig(fail_fast="raise")`` raises for ``trial``'s failure."""
    why = decision.reason if not decision.should_retry else "the sweep was stopping"
    errors = [e for t in trials if t.status is TrialStatus.ERROR for e in t.errors]
    return TuneFailedError(
        f"trial {trial.trial_name!r} failed ({why}) and FailureConfig(fail_fast='raise') "
        "raises its error; fail_fast=True stops the sweep and returns its ResultGrid, "
        "fail_fast=False lets other trials go on",
        [TrialError.from_record(e) for e in errors],
    )


def worker_failure(error: TrialErrorRecord) -> WorkerFailure:
    """The runtime's description of a trial's error (one worker: rank 0)."""
    kind = _LOST_KINDS.get(error.exc_type, FailureKind.USER_ERROR)
    return WorkerFailure(0, kind, message=f"{error.exc_type}: {error.error_message}")


class TrialFailures:
    """Applies the runtime's failure policy to each trial: retry it or let it fail.

    Args:
        max_failures: ``FailureConfig(max_failures=...)`` (per trial).
        policy: The policy to apply (default ``DefaultFailurePolicy(max_failures)``).
    """

    def __init__(self, max_failures: int, policy: FailurePolicy | None = None) -> None:
        self.policy = policy or DefaultFailurePolicy(max_failures)

    def decide(self, trial: LiveTrial) -> FailureDecision:
        """The decision about the trial's latest error (already in ``trial.errors``)."""
        latest = trial.errors[-1]
        return self.policy.make_decision([worker_failure(latest)], len(trial.errors) - 1)
