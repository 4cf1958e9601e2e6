"""Ray Tune's demo class trainable (``ray.tune.utils.mock_trainable``), on ``lumos.tune``.

``MyTrainableClass`` reports ``episode_reward_mean`` along a sigmoid: ``height *
tanh(step / width)``, so the config's ``width`` sets the slope and ``height`` the top.
Ray's examples (``hyperband_example``, ``pbt_example``-style sweeps) run it to show a
scheduler at work without training a model.

Example:
    >>> from lumos.tune.utils.mock_trainable import MyTrainableClass
    >>> grid = tune.Tuner(
    ...     MyTrainableClass,
    ...     param_space={"width": tune.randint(10, 90), "height": tune.randint(0, 100)},
    ...     tune_config=tune.TuneConfig(metric="episode_reward_mean", mode="max",
    ...                                 num_samples=4, stop={"training_iteration": 5}),
    ... ).fit()
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from lumos.tune._internal.trainable import Trainable

__all__ = ["MOCK_ERROR_KEY", "MOCK_TRAINABLE_NAME", "MyTrainableClass"]

MOCK_TRAINABLE_NAME = "mock_trainable"
"""Ray's registered name of the class (lumos has no trainable registry: pass the class)."""

MOCK_ERROR_KEY = "mock_error"
"""Config key: ``True`` makes a step after the first checkpoint fail (until restored)."""


class MyTrainableClass(Trainable):
    """Example agent whose learning curve is a sigmoid (Ray's demo class).

    Config keys (all optional): ``width`` (default 1) and ``height`` (default 1) shape
    the curve, ``sleep`` (seconds per step), ``mock_error`` (fail once after the first
    step, until restored from a checkpoint) and ``persistent_error`` (fail after every
    restore too). Saves and restores its step count in a ``checkpoint`` file.

    Example:
        >>> tune.Tuner(MyTrainableClass, param_space={"width": 20, "height": 50},
        ...            tune_config=tune.TuneConfig(stop={"training_iteration": 10}))
    """

    def setup(self, config: dict[str, Any], **kwargs: Any) -> None:
        """Read the curve's shape and the failure switches from the config."""
        self._sleep_time = float(config.get("sleep", 0))
        self._mock_error = bool(config.get(MOCK_ERROR_KEY, False))
        self._persistent_error = bool(config.get("persistent_error", False))
        self.timestep = 0
        self.restored = False

    def step(self) -> dict[str, Any]:
        """One step along the curve: ``{"episode_reward_mean": v}``."""
        if (
            self._mock_error
            and self.timestep > 0  # at least one successful checkpoint first
            and (self._persistent_error or not self.restored)
        ):
            raise RuntimeError(f"Failing on purpose! self.timestep={self.timestep}")
        if self._sleep_time > 0:
            time.sleep(self._sleep_time)
        self.timestep += 1
        v = math.tanh(float(self.timestep) / self.config.get("width", 1))
        v *= self.config.get("height", 1)
        return {"episode_reward_mean": v}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write the step count into ``checkpoint_dir/checkpoint``."""
        with open(os.path.join(checkpoint_dir, "checkpoint"), "w") as f:
            f.write(json.dumps({"timestep": self.timestep}))

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Read the step count back from the checkpoint directory."""
        directory = str(checkpoint)  # a directory: save_checkpoint returns no dict
        with open(os.path.join(directory, "checkpoint")) as f:
            self.timestep = json.loads(f.read())["timestep"]
        self.restored = True
