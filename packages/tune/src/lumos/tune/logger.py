"""Loggers, as in Ray Tune's ``ray.tune.logger``: subclass :class:`LoggerCallback` (Ray's
``log_trial_start`` / ``log_trial_result`` / ``log_trial_end`` hooks) or use a shipped one.

Example:
    >>> from lumos.tune.logger import LoggerCallback
    >>> class PrintLogger(LoggerCallback):
    ...     def log_trial_result(self, iteration, trial, result):
    ...         print(trial.trial_name, result)
    >>> tune.RunConfig(callbacks=[PrintLogger()])
"""

from __future__ import annotations

from lumos.tune._internal.callbacks import (
    CSVLoggerCallback,
    JSONLoggerCallback,
    LoggerCallback,
    TBXLoggerCallback,
)
from lumos.tune._internal.trackers import MLflowLoggerCallback, WandbLoggerCallback

__all__ = [
    "CSVLoggerCallback",
    "JSONLoggerCallback",
    "JsonLoggerCallback",
    "LoggerCallback",
    "MLflowLoggerCallback",
    "TBXLoggerCallback",
    "WandbLoggerCallback",
]

JsonLoggerCallback = JSONLoggerCallback
"""Ray's spelling (``ray.tune.logger.JsonLoggerCallback``) of :class:`JSONLoggerCallback`."""
