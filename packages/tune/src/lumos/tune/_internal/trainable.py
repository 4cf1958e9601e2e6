"""Ray Tune's class API: ``tune.Trainable`` with ``setup``, ``step``,
``save_checkpoint`` and ``load_checkpoint``, run as a trial function.

:class:`ClassTrainable` turns a ``Trainable`` subclass into the function lumos runs:
it builds the object (``setup(config)``), restores it from ``tune.get_checkpoint()``,
then calls ``step()`` and reports each result (with a checkpoint every
``checkpoint_frequency`` steps and at the end) until the result says ``done`` or the
driver stops the trial (stop criteria, pruner, PBT).
"""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
from typing import Any

from lumos.storage import Checkpoint
from lumos.tune._internal.session import (
    current_session,
    get_checkpoint,
    report,
)
from lumos.tune.result import DONE, SHOULD_CHECKPOINT

_DICT_CHECKPOINT = "_dict_checkpoint.pkl"


class Trainable:
    """Subclass it and give the class to :class:`~lumos.tune.Tuner` (Ray's class API).

    Implement ``setup(config)``, ``step() -> dict`` and, to be resumable (retries,
    restores, PBT), ``save_checkpoint(checkpoint_dir) -> dict | None`` and
    ``load_checkpoint(checkpoint)`` (the dict ``save_checkpoint`` returned, or the
    directory it wrote). A result with ``"done": True`` ends the trial; otherwise it
    runs until a stop criterion, the pruner or the time budget ends it. A result with
    ``"should_checkpoint": True`` (``lumos.tune.result.SHOULD_CHECKPOINT``) saves a
    checkpoint after that step.

    Attributes:
        checkpoint_frequency: Save a checkpoint every this many steps (0: only at the
            end). Default 1 (every step, as PBT needs).
        config: The trial's config.
        iteration: Steps done (``training_iteration``), restored ones included.

    Example:
        >>> class Counter(tune.Trainable):
        ...     def setup(self, config):
        ...         self.x = 0
        ...     def step(self):
        ...         self.x += self.config["lr"]
        ...         return {"loss": 1.0 / (1 + self.x)}
        ...     def save_checkpoint(self, checkpoint_dir):
        ...         return {"x": self.x}
        ...     def load_checkpoint(self, checkpoint):
        ...         self.x = checkpoint["x"]
        >>> tune.Tuner(Counter, param_space={"lr": tune.uniform(0, 1)},
        ...            tune_config=tune.TuneConfig(stop={"training_iteration": 10}))
    """

    checkpoint_frequency: int = 1

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.config: dict[str, Any] = dict(config or {})
        session = current_session()
        self.iteration = session.iteration if session is not None else 0
        self.setup(copy.deepcopy(self.config), **kwargs)

    @property
    def training_iteration(self) -> int:
        """Alias of :attr:`iteration` (Ray's name)."""
        return self.iteration

    @property
    def trial_name(self) -> str:
        """The trial's name."""
        session = current_session()
        return session.context.get_trial_name() if session is not None else ""

    @property
    def trial_id(self) -> str:
        """The trial's id."""
        session = current_session()
        return session.context.get_trial_id() if session is not None else ""

    def setup(self, config: dict[str, Any], **kwargs: Any) -> None:
        """Build the model, data, ... (``kwargs``: ``tune.with_parameters`` objects)."""

    def step(self) -> dict[str, Any]:
        """One training step; returns its metrics (``"done": True`` ends the trial)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """Write the state into ``checkpoint_dir`` or return it as a (picklable) dict."""
        return None

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Restore what :meth:`save_checkpoint` saved (its dict, or the directory)."""

    def cleanup(self) -> None:
        """Release resources when the trial ends."""


def _saves(cls: type[Trainable]) -> bool:
    return cls.save_checkpoint is not Trainable.save_checkpoint


class ClassTrainable:
    """The trial function running a :class:`Trainable` subclass."""

    def __init__(self, cls: type[Trainable]) -> None:
        self.cls = cls
        self.__name__ = cls.__name__

    def __call__(self, config: dict[str, Any], **kwargs: Any) -> None:
        trainable = self.cls(config, **kwargs)
        try:
            checkpoint = get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as d:
                    trainable.load_checkpoint(_restored(d))
            saves = _saves(self.cls)
            freq, at_end = _frequency(trainable, saves)
            while True:
                result = dict(trainable.step() or {})
                trainable.iteration += 1
                done = bool(result.get(DONE, False))
                asked = saves and bool(result.get(SHOULD_CHECKPOINT, False))
                if asked or (done and at_end) or (freq > 0 and trainable.iteration % freq == 0):
                    with tempfile.TemporaryDirectory() as d:
                        _save(trainable, d)
                        report(result, checkpoint=Checkpoint.from_directory(d))
                else:
                    report(result)
                session = current_session()
                if done or (session is not None and session.settle()):
                    return
        finally:
            trainable.cleanup()

    def __repr__(self) -> str:
        return f"ClassTrainable({self.cls.__name__})"


def _frequency(trainable: Trainable, saves: bool) -> tuple[int, bool]:
    """(save every N steps, save at the end): ``CheckpointConfig`` wins over the class."""
    if not saves:
        return 0, False
    session = current_session()
    sweep = session.sweep if session is not None else None
    freq = trainable.checkpoint_frequency
    if sweep is not None and sweep.checkpoint_frequency > 0:
        freq = sweep.checkpoint_frequency
    at_end = True
    if sweep is not None and sweep.checkpoint_at_end is not None:
        at_end = sweep.checkpoint_at_end
    return freq, at_end


def _save(trainable: Trainable, directory: str) -> None:
    state = trainable.save_checkpoint(directory)
    if state is not None:
        with open(os.path.join(directory, _DICT_CHECKPOINT), "wb") as f:
            pickle.dump(state, f)


def _restored(directory: str) -> dict[str, Any] | str:
    path = os.path.join(directory, _DICT_CHECKPOINT)
    if os.path.exists(path):
        with open(path, "rb") as f:
            state: dict[str, Any] = pickle.load(f)
        return state
    return directory


def as_function(trainable: Any) -> Any:
    """A :class:`Trainable` subclass as its trial function; anything else unchanged."""
    if isinstance(trainable, type) and issubclass(trainable, Trainable):
        return ClassTrainable(trainable)
    return trainable
