"""Experiment trackers for Train, as Ray's ``ray.air.integrations``:
``lumos.train.integrations.mlflow`` and ``lumos.train.integrations.wandb`` (extras
``lumos-train[mlflow]``, ``lumos-train[wandb]``; importing one without its tracker raises an
``ImportError`` that names the extra).

Example:
    >>> from lumos.train.integrations.mlflow import MLflowLoggerCallback
    >>> RunConfig(callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db")])  # doctest: +SKIP
"""
