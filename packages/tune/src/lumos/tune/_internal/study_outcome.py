"""Telling the Optuna study how a trial ended (used by the controller and by restore)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from lumos.tune._internal import optuna_bridge
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.metrics import finite_or_none
from lumos.tune._internal.trial import TrialStatus


def objective_values(trial: LiveTrial, tune_config: TuneConfig) -> list[float] | None:
    """The trial's objective values: the last reported value of each metric."""
    metrics = tune_config.metrics
    if not metrics:
        return [0.0]
    values: list[float] = []
    for name in metrics:
        value = None
        for row in reversed(trial.history):
            if name in row:
                value = finite_or_none(row[name])
                break
        if value is None:
            return None
        values.append(value)
    return values


def tell_study(study: optuna.Study, trial: LiveTrial, tune_config: TuneConfig) -> None:
    """Tell the study how ``trial`` ended (idempotent for already finished trials)."""
    target: optuna.Trial | int
    if trial.optuna_trial is not None:
        target = trial.optuna_trial  # asked (or re-attached) by this driver: still running
    else:
        if optuna_bridge.stored_trial(study, trial.number).state.is_finished():
            return
        target = trial.number
    if trial.status is TrialStatus.PRUNED:
        optuna_bridge.tell(study, target, state=TrialState.PRUNED)
    elif trial.status is TrialStatus.ERROR:
        optuna_bridge.tell(study, target, state=TrialState.FAIL)
    else:
        values = objective_values(trial, tune_config)
        if values is None:
            optuna_bridge.tell(study, target, state=TrialState.FAIL)
        else:
            optuna_bridge.tell(study, target, values)
