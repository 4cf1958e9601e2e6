"""Exceptions pickle with their fields (they cross Ray processes) and read well."""

from __future__ import annotations

import pickle

import optuna
import pytest

from lumos import tune


@pytest.mark.parametrize(
    "error",
    [
        tune.TrialPruned("pruned at step 3"),
        tune.TrialError(
            "trial_00001", 2, "ValueError", "bad lr", "Traceback ...\nValueError: bad lr"
        ),
        tune.MetricNotReportedError("loss", "trial_00000", ["acc"]),
        tune.TuneFailedError("stopped", [tune.TrialError("t", 0, "E", "m")]),
        tune.SearchSpaceError("uniform(low=1, high=0): low must be <= high"),
    ],
)
def test_errors_pickle_with_their_fields(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert repr(vars(again)) == repr(vars(error))  # nested exceptions compare by identity


def test_hierarchy() -> None:
    assert issubclass(tune.TrialPruned, tune.TuneError)
    assert issubclass(tune.TrialPruned, optuna.TrialPruned)
    assert issubclass(tune.SearchSpaceError, ValueError)
    for cls in (tune.TrialError, tune.MetricNotReportedError, tune.TuneFailedError):
        assert issubclass(cls, tune.TuneError)


def test_messages_name_the_way_out() -> None:
    msg = str(tune.MetricNotReportedError("loss", "trial_00000", ["acc"]))
    assert "TuneConfig(metric='loss')" in msg
    assert "'acc'" in msg
    err = tune.TrialError(
        "trial_00001", 2, "ValueError", "bad lr", "Traceback ...\nValueError: bad lr"
    )
    assert str(err).startswith("Trial 'trial_00001' (attempt 2) failed: ValueError: bad lr")
    assert "Traceback" in str(err)
