"""MLflow for Tune, as Ray's ``ray.air.integrations.mlflow``: one MLflow run per trial.

Importing it without MLflow raises an ``ImportError`` naming ``lumos-tune[mlflow]``.

Example:
    >>> from lumos.tune.integrations.mlflow import MLflowLoggerCallback
    >>> tune.RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db")])
"""

from __future__ import annotations

from lumos.tune._internal.trackers import MLflowLoggerCallback, import_tracker

import_tracker("mlflow", "mlflow")

__all__ = ["MLflowLoggerCallback"]
