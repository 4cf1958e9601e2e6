"""Stopper objects, as in Ray Tune's ``ray.tune.stopper`` (give one as ``TuneConfig(stop=...)``).

Example:
    >>> from lumos.tune.stopper import CombinedStopper, MaximumIterationStopper, TimeoutStopper
    >>> tune.TuneConfig(stop=CombinedStopper(MaximumIterationStopper(20), TimeoutStopper(600)))
"""

from __future__ import annotations

from lumos.tune._internal.plateau_stopper import ExperimentPlateauStopper
from lumos.tune._internal.stoppers import (
    CombinedStopper,
    FunctionStopper,
    MaximumIterationStopper,
    NoopStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
)

__all__ = [
    "CombinedStopper",
    "ExperimentPlateauStopper",
    "FunctionStopper",
    "MaximumIterationStopper",
    "NoopStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
]
