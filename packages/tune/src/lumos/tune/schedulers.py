"""Ray Tune's schedulers under their Ray names (``ray.tune.schedulers``).

The early-stopping ones become the matching Optuna pruner (``TuneConfig(pruner=...)``);
``PopulationBasedTraining`` is lumos's own PBT.

| Ray scheduler | Optuna pruner |
| --- | --- |
| ``ASHAScheduler`` / ``AsyncHyperBandScheduler(max_t, grace_period, reduction_factor)`` | ``SuccessiveHalvingPruner(min_resource=grace_period, reduction_factor)``, stop at ``max_t`` |
| ``HyperBandScheduler(max_t, reduction_factor)`` | ``HyperbandPruner(1, max_t, reduction_factor)`` |
| ``MedianStoppingRule(grace_period, min_samples_required)`` | ``MedianPruner(n_warmup_steps=grace_period, n_startup_trials=min_samples_required)`` |
| ``FIFOScheduler()`` | ``NopPruner()`` |

Example:
    >>> from lumos.tune.schedulers import ASHAScheduler
    >>> tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(max_t=20))
"""

from __future__ import annotations

from lumos.tune._internal.pbt import PopulationBasedTraining
from lumos.tune._internal.ray_compat import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PrunerScheduler,
)
from lumos.tune._internal.ray_names import create_scheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "PrunerScheduler",
    "create_scheduler",
]
