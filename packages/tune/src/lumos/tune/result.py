"""The result keys of Ray Tune's ``ray.tune.result`` that mean the same in lumos.

Only keys lumos honours or fills are here: ``from ray.tune.result import X`` of any
other key fails with ImportError rather than naming a key lumos would silently ignore
(lumos fills ``training_iteration`` only: Ray's ``time_total_s``, ``timestamp``,
``trial_id``, ``pid``, ... are not in a lumos result).

Example:
    >>> from lumos.tune.result import SHOULD_CHECKPOINT, TRAINING_ITERATION
    >>> class Model(tune.Trainable):
    ...     def step(self):
    ...         return {"loss": 0.1, SHOULD_CHECKPOINT: self.iteration % 5 == 4}
    >>> tune.TuneConfig(stop={TRAINING_ITERATION: 20})
"""

from __future__ import annotations

__all__ = [
    "DONE",
    "EPISODE_REWARD_MEAN",
    "MEAN_ACCURACY",
    "MEAN_LOSS",
    "SHOULD_CHECKPOINT",
    "TRAINING_ITERATION",
]

DONE = "done"
"""A ``tune.Trainable`` step result with ``{DONE: True}`` ends the trial (saving its
checkpoint at the end); ``stop={DONE: True}`` stops a trial reporting it."""

SHOULD_CHECKPOINT = "should_checkpoint"
"""A ``tune.Trainable`` step result with ``{SHOULD_CHECKPOINT: True}`` saves a checkpoint
after that step, whatever ``checkpoint_frequency`` says (a class that overrides
``save_checkpoint``). Set in the step result only: a driver callback cannot ask for one."""

TRAINING_ITERATION = "training_iteration"
"""Filled in by lumos: 1, 2, ... for each report of a trial (restored reports counted);
the default ``time_attr`` of the schedulers and the key of ``stop={...: N}``."""

EPISODE_REWARD_MEAN = "episode_reward_mean"
"""A conventional metric name (reported by the trial, e.g. ``MyTrainableClass``)."""

MEAN_LOSS = "mean_loss"
"""A conventional metric name (reported by the trial)."""

MEAN_ACCURACY = "mean_accuracy"
"""A conventional metric name (reported by the trial)."""
