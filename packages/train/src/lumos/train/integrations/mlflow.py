"""MLflow for Train (Ray's ``ray.air.integrations.mlflow``): ``MLflowLoggerCallback`` logs
the run from the driver; ``setup_mlflow`` starts a run inside the training function.

Example:
    >>> from lumos.train.integrations.mlflow import MLflowLoggerCallback
    >>> RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db")])  # doctest: +SKIP
"""

from __future__ import annotations

from lumos.train._internal.trackers.mlflow import MLflowLoggerCallback, setup_mlflow

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
