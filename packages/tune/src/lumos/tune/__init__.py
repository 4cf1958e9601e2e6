"""lumos.tune: Optuna-backed hyperparameter search on Ray.

Trials run on a pool of reused Ray actors; an Optuna study driven by ask/tell
in the driver is the searcher (any Optuna sampler) and Optuna pruners stop bad
trials early. The experiment (study included) lives on any fsspec storage and
resumes after a driver crash.

Example:
    >>> import optuna
    >>> from lumos import tune
    >>> def objective(config):
    ...     for step in range(20):
    ...         tune.report({"loss": (config["x"] - 2) ** 2 / (step + 1)})
    >>> grid = tune.Tuner(
    ...     objective,
    ...     param_space={"x": tune.uniform(-10, 10)},
    ...     tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=50,
    ...                                 sampler=optuna.samplers.TPESampler(seed=0),
    ...                                 pruner=optuna.pruners.SuccessiveHalvingPruner()),
    ...     run_config=tune.RunConfig(name="sweep-7", storage_path="~/lumos_results"),
    ... ).fit()
    >>> grid.get_best_result().config
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime._internal.lazy import lazy_attributes
from lumos.tune._version import __version__

if TYPE_CHECKING:
    from lumos.storage import Checkpoint, CheckpointConfig
    from lumos.tune._internal.callbacks import (
        Callback,
        CSVLoggerCallback,
        JSONLoggerCallback,
        TBXLoggerCallback,
    )
    from lumos.tune._internal.config import FailureConfig, RunConfig, TuneConfig
    from lumos.tune._internal.errors import (
        MetricNotReportedError,
        SearchSpaceError,
        TrialError,
        TrialPruned,
        TuneError,
        TuneFailedError,
    )
    from lumos.tune._internal.result import Result, ResultGrid
    from lumos.tune._internal.search_space import (
        choice,
        grid_search,
        lograndint,
        loguniform,
        qloguniform,
        qrandint,
        quniform,
        randint,
        uniform,
    )
    from lumos.tune._internal.session import TrialContext, get_checkpoint, get_context, report
    from lumos.tune._internal.study import export_study_journal, load_study
    from lumos.tune._internal.trial import Trial, TrialStatus
    from lumos.tune._internal.tuner import Tuner

_LAZY: dict[str, str] = {
    "Checkpoint": "lumos.storage",
    "CheckpointConfig": "lumos.storage",
    "Callback": "lumos.tune._internal.callbacks",
    "CSVLoggerCallback": "lumos.tune._internal.callbacks",
    "JSONLoggerCallback": "lumos.tune._internal.callbacks",
    "TBXLoggerCallback": "lumos.tune._internal.callbacks",
    "FailureConfig": "lumos.tune._internal.config",
    "RunConfig": "lumos.tune._internal.config",
    "TuneConfig": "lumos.tune._internal.config",
    "MetricNotReportedError": "lumos.tune._internal.errors",
    "SearchSpaceError": "lumos.tune._internal.errors",
    "TrialError": "lumos.tune._internal.errors",
    "TrialPruned": "lumos.tune._internal.errors",
    "TuneError": "lumos.tune._internal.errors",
    "TuneFailedError": "lumos.tune._internal.errors",
    "Result": "lumos.tune._internal.result",
    "ResultGrid": "lumos.tune._internal.result",
    "choice": "lumos.tune._internal.search_space",
    "grid_search": "lumos.tune._internal.search_space",
    "lograndint": "lumos.tune._internal.search_space",
    "loguniform": "lumos.tune._internal.search_space",
    "qloguniform": "lumos.tune._internal.search_space",
    "qrandint": "lumos.tune._internal.search_space",
    "quniform": "lumos.tune._internal.search_space",
    "randint": "lumos.tune._internal.search_space",
    "uniform": "lumos.tune._internal.search_space",
    "TrialContext": "lumos.tune._internal.session",
    "get_checkpoint": "lumos.tune._internal.session",
    "get_context": "lumos.tune._internal.session",
    "report": "lumos.tune._internal.session",
    "export_study_journal": "lumos.tune._internal.study",
    "load_study": "lumos.tune._internal.study",
    "Trial": "lumos.tune._internal.trial",
    "TrialStatus": "lumos.tune._internal.trial",
    "Tuner": "lumos.tune._internal.tuner",
}

__all__ = [
    "CSVLoggerCallback",
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "JSONLoggerCallback",
    "MetricNotReportedError",
    "Result",
    "ResultGrid",
    "RunConfig",
    "SearchSpaceError",
    "TBXLoggerCallback",
    "Trial",
    "TrialContext",
    "TrialError",
    "TrialPruned",
    "TrialStatus",
    "TuneConfig",
    "TuneError",
    "TuneFailedError",
    "Tuner",
    "__version__",
    "choice",
    "export_study_journal",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "load_study",
    "lograndint",
    "loguniform",
    "qloguniform",
    "qrandint",
    "quniform",
    "randint",
    "report",
    "uniform",
]


__getattr__, __dir__ = lazy_attributes("lumos.tune", _LAZY, globals(), __all__)
