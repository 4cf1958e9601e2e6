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

from lumos.runtime import lazy_attributes
from lumos.tune._version import __version__ as __version__

if TYPE_CHECKING:
    from lumos.storage import Checkpoint as Checkpoint, CheckpointConfig as CheckpointConfig
    from lumos.tune._internal.callbacks import (
        Callback as Callback,
        CSVLoggerCallback as CSVLoggerCallback,
        JSONLoggerCallback as JSONLoggerCallback,
        TBXLoggerCallback as TBXLoggerCallback,
    )
    from lumos.tune._internal.config import (
        FailureConfig as FailureConfig,
        RunConfig as RunConfig,
        TuneConfig as TuneConfig,
    )
    from lumos.tune._internal.errors import (
        MetricNotReportedError as MetricNotReportedError,
        SearchSpaceError as SearchSpaceError,
        TrialError as TrialError,
        TrialErrorRecord as TrialErrorRecord,
        TrialPruned as TrialPruned,
        TuneConfigError as TuneConfigError,
        TuneError as TuneError,
        TuneFailedError as TuneFailedError,
        TuneTypeError as TuneTypeError,
    )
    from lumos.tune._internal.result import Result as Result, ResultGrid as ResultGrid
    from lumos.tune._internal.search_space import (
        choice as choice,
        grid_search as grid_search,
        lograndint as lograndint,
        loguniform as loguniform,
        qloguniform as qloguniform,
        qrandint as qrandint,
        quniform as quniform,
        randint as randint,
        uniform as uniform,
    )
    from lumos.tune._internal.session import (
        TrialContext as TrialContext,
        get_checkpoint as get_checkpoint,
        get_context as get_context,
        report as report,
    )
    from lumos.tune._internal.study import (
        export_study_journal as export_study_journal,
        load_study as load_study,
    )
    from lumos.tune._internal.trial import Trial as Trial, TrialStatus as TrialStatus
    from lumos.tune._internal.tuner import Tuner as Tuner

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
    "TrialErrorRecord": "lumos.tune._internal.errors",
    "TuneConfigError": "lumos.tune._internal.errors",
    "TuneTypeError": "lumos.tune._internal.errors",
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

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.tune", _LAZY, globals(), eager=("__version__",)
)
