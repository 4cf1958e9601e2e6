"""Weights & Biases for Tune, as Ray's ``ray.air.integrations.wandb``: one W&B run per trial.

Importing it without wandb raises an ``ImportError`` naming ``lumos-tune[wandb]``.

Example:
    >>> from lumos.tune.integrations.wandb import WandbLoggerCallback
    >>> tune.RunConfig(callbacks=[WandbLoggerCallback(project="sweeps")])
"""

from __future__ import annotations

from lumos.tune._internal.trackers import WandbLoggerCallback, import_tracker

import_tracker("wandb", "wandb")

__all__ = ["WandbLoggerCallback"]
