"""Shared helpers for the unit tests (no Ray)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lumos.storage import RunStorage
from lumos.tune import TuneConfig
from lumos.tune._internal.controller import ControllerSettings, TuneController
from lumos.tune._internal.experiment import open_experiment
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.search_space import ParamSpace, SearchSpace
from lumos.tune.testing import ScriptedExecutor, Step


class RecordingProgress:
    """A progress sink that records what the controller tells it."""

    def __init__(self) -> None:
        self.updates = 0
        self.done: list[str] = []
        self.waiting: list[list[str]] = []

    def update(self, trials: list[LiveTrial], *, force: bool = False) -> None:
        self.updates += 1

    def trial_done(self, trial: LiveTrial) -> None:
        self.done.append(trial.trial_name)

    def waiting_for_resources(self, trials: list[LiveTrial], resources: dict[str, float]) -> None:
        self.waiting.append([t.trial_name for t in trials])


class FakeClock:
    """A monotonic clock advanced by hand (or by the executor on every poll)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_controller(
    storage_path: str,
    script: Callable[[Any], list[Step]],
    tune_config: TuneConfig,
    param_space: ParamSpace = None,
    *,
    name: str = "exp",
    max_concurrent: int = 2,
    max_failures: int = 0,
    capacity: int | None = None,
    progress: Any = None,
    clock: Callable[[], float] | None = None,
    executor: ScriptedExecutor | None = None,
    **settings: Any,
) -> tuple[TuneController, ScriptedExecutor]:
    space = SearchSpace(param_space if param_space is not None else {})
    storage = RunStorage(storage_path, name)
    exp = open_experiment(storage, space, tune_config)
    ex = executor or ScriptedExecutor(script, capacity=capacity)
    kwargs: dict[str, Any] = {}
    if clock is not None:
        kwargs["clock"] = clock
    ctl = TuneController(
        exp,
        space,
        tune_config,
        ex,
        ControllerSettings(
            max_concurrent_trials=max_concurrent, max_failures=max_failures, **settings
        ),
        progress=progress,
        resources={"CPU": 1.0},
        **kwargs,
    )
    return ctl, ex
