"""Experiment trackers, as Ray's ``ray.air.integrations``: ``lumos.tune.integrations.mlflow``
and ``lumos.tune.integrations.wandb`` (extras ``lumos-tune[mlflow]``, ``lumos-tune[wandb]``).

Example:
    >>> from lumos.tune.integrations.mlflow import MLflowLoggerCallback
    >>> tune.RunConfig(callbacks=[MLflowLoggerCallback(experiment_name="sweep-7")])
"""
