"""Weights & Biases for Train (Ray's ``ray.air.integrations.wandb``):
``WandbLoggerCallback`` logs the run from the driver; ``setup_wandb`` starts a run inside
the training function.

Example:
    >>> from lumos.train.integrations.wandb import WandbLoggerCallback
    >>> RunConfig(callbacks=[WandbLoggerCallback(project="resnet")])  # doctest: +SKIP
"""

from __future__ import annotations

from lumos.train._internal.trackers.wandb import WandbLoggerCallback, setup_wandb

__all__ = ["WandbLoggerCallback", "setup_wandb"]
