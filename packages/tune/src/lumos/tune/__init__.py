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
    from lumos.storage import Checkpoint as Checkpoint
    from lumos.tune import (
        integration as integration,
        integrations as integrations,
        logger as logger,
        result as result,
        schedulers as schedulers,
        search as search,
        stopper as stopper,
        utils as utils,
    )
    from lumos.tune._internal.callbacks import (
        Callback as Callback,
        CSVLoggerCallback as CSVLoggerCallback,
        JSONLoggerCallback as JSONLoggerCallback,
        TBXLoggerCallback as TBXLoggerCallback,
    )
    from lumos.tune._internal.config import (
        CheckpointConfig as CheckpointConfig,
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
    from lumos.tune._internal.pbt import PopulationBasedTraining as PopulationBasedTraining
    from lumos.tune._internal.ray_names import (
        TuneContext as TuneContext,
        create_scheduler as create_scheduler,
        create_searcher as create_searcher,
    )
    from lumos.tune._internal.result import Result as Result, ResultGrid as ResultGrid
    from lumos.tune._internal.sample import (
        choice as choice,
        grid_search as grid_search,
        lograndint as lograndint,
        loguniform as loguniform,
        qlograndint as qlograndint,
        qloguniform as qloguniform,
        qrandint as qrandint,
        qrandn as qrandn,
        quniform as quniform,
        randint as randint,
        randn as randn,
        sample_from as sample_from,
        uniform as uniform,
    )
    from lumos.tune._internal.session import (
        get_checkpoint as get_checkpoint,
        get_context as get_context,
        report as report,
    )
    from lumos.tune._internal.stoppers import Stopper as Stopper
    from lumos.tune._internal.study import (
        export_study_journal as export_study_journal,
        load_study as load_study,
    )
    from lumos.tune._internal.trainable import Trainable as Trainable
    from lumos.tune._internal.trial import Trial as Trial, TrialStatus as TrialStatus
    from lumos.tune._internal.trial_spec import TrialContext as TrialContext
    from lumos.tune._internal.tuner import Tuner as Tuner
    from lumos.tune._internal.wrappers import (
        with_parameters as with_parameters,
        with_resources as with_resources,
    )

_LAZY: dict[str, str] = {
    "Checkpoint": "lumos.storage",
    "CheckpointConfig": "lumos.tune._internal.config",
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
    "PopulationBasedTraining": "lumos.tune._internal.pbt",
    "TuneContext": "lumos.tune._internal.ray_names",
    "create_scheduler": "lumos.tune._internal.ray_names",
    "create_searcher": "lumos.tune._internal.ray_names",
    "Result": "lumos.tune._internal.result",
    "ResultGrid": "lumos.tune._internal.result",
    "choice": "lumos.tune._internal.sample",
    "grid_search": "lumos.tune._internal.sample",
    "lograndint": "lumos.tune._internal.sample",
    "loguniform": "lumos.tune._internal.sample",
    "qlograndint": "lumos.tune._internal.sample",
    "qloguniform": "lumos.tune._internal.sample",
    "qrandint": "lumos.tune._internal.sample",
    "qrandn": "lumos.tune._internal.sample",
    "quniform": "lumos.tune._internal.sample",
    "randint": "lumos.tune._internal.sample",
    "randn": "lumos.tune._internal.sample",
    "sample_from": "lumos.tune._internal.sample",
    "uniform": "lumos.tune._internal.sample",
    "TrialContext": "lumos.tune._internal.trial_spec",
    "get_checkpoint": "lumos.tune._internal.session",
    "get_context": "lumos.tune._internal.session",
    "report": "lumos.tune._internal.session",
    "Stopper": "lumos.tune._internal.stoppers",
    "export_study_journal": "lumos.tune._internal.study",
    "load_study": "lumos.tune._internal.study",
    "Trial": "lumos.tune._internal.trial",
    "TrialStatus": "lumos.tune._internal.trial",
    "Trainable": "lumos.tune._internal.trainable",
    "Tuner": "lumos.tune._internal.tuner",
    "integration": "lumos.tune.integration",
    "integrations": "lumos.tune.integrations",
    "logger": "lumos.tune.logger",
    "result": "lumos.tune.result",
    "schedulers": "lumos.tune.schedulers",
    "search": "lumos.tune.search",
    "stopper": "lumos.tune.stopper",
    "utils": "lumos.tune.utils",
    "with_parameters": "lumos.tune._internal.wrappers",
    "with_resources": "lumos.tune._internal.wrappers",
}

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.tune", _LAZY, globals(), eager=("__version__",)
)
