"""Ray's callback API on lumos: ``Callback`` hooks written Ray's way (``iteration``,
``trials``, ``trial``, ``**info``) or lumos's, ``on_checkpoint``, and
``lumos.tune.logger.LoggerCallback``'s ``log_trial_*`` hooks. No Ray: a fake pool."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import optuna

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.tune.logger import LoggerCallback


def _objective(config: dict[str, Any]) -> None:
    for step in range(2):
        if config["x"] < 0:
            raise ValueError("negative")
        with tempfile.TemporaryDirectory() as d:
            tune.report({"loss": config["x"] + step}, checkpoint=tune.Checkpoint.from_directory(d))


class RayStyle(tune.Callback):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def setup(self, stop: Any = None, num_samples: Any = None, **info: Any) -> None:
        self.events.append(("setup", num_samples, sorted(info)))

    def on_trial_start(
        self, iteration: int, trials: Sequence[tune.Trial], trial: tune.Trial, **info: Any
    ) -> None:
        self.events.append(("start", trial.trial_name, len(trials), type(iteration)))

    def on_trial_result(
        self,
        iteration: int,
        trials: Sequence[tune.Trial],
        trial: tune.Trial,
        result: dict[str, Any],
        **info: Any,
    ) -> None:
        assert trials[-1].trial_name in {t.trial_name for t in trials}
        self.events.append(("result", trial.trial_name, result["loss"]))

    def on_checkpoint(
        self,
        iteration: int,
        trials: Sequence[tune.Trial],
        trial: tune.Trial,
        checkpoint: tune.Checkpoint,
        **info: Any,
    ) -> None:
        self.events.append(("checkpoint", trial.trial_name, checkpoint.path.rsplit("/", 1)[-1]))

    def on_trial_error(
        self, iteration: int, trials: Sequence[tune.Trial], trial: tune.Trial, **info: Any
    ) -> None:
        self.events.append(("error", trial.trial_name))

    def on_trial_complete(
        self, iteration: int, trials: Sequence[tune.Trial], trial: tune.Trial, **info: Any
    ) -> None:
        self.events.append(("complete", trial.trial_name))


class LumosStyle(tune.Callback):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_trial_result(self, trial: tune.Trial, result: dict[str, Any]) -> None:
        self.events.append(("result", trial.trial_name, result["loss"]))


class Logger(LoggerCallback):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def log_trial_start(self, trial: tune.Trial) -> None:
        self.events.append(("start", trial.trial_name, trial.trainable_name))

    def log_trial_result(self, iteration: int, trial: tune.Trial, result: dict[str, Any]) -> None:
        self.events.append(("result", trial.trial_name, result["loss"], iteration > 0))

    def log_trial_end(self, trial: tune.Trial, failed: bool = False) -> None:
        self.events.append(("end", trial.trial_name, failed))


def test_ray_style_lumos_style_and_logger_callbacks_all_hear_the_sweep(tmp_path: Any) -> None:
    ray_style, lumos_style, logger = RayStyle(), LumosStyle(), Logger()
    grid = tune.Tuner(
        _objective,
        param_space={"x": tune.grid_search([1.0, -1.0])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            max_concurrent_trials=1,
            sampler=optuna.samplers.RandomSampler(),
        ),
        run_config=tune.RunConfig(
            name="cb",
            storage_path=str(tmp_path),
            verbose=0,
            callbacks=[ray_style, lumos_style, logger],
        ),
        _pool_factory=lambda resources: FakeWorkerPool(resources),
    ).fit()
    assert grid.num_terminated == 1
    assert grid.num_errors == 1
    ok, bad = "trial_00000", "trial_00001"
    assert ray_style.events == [
        ("setup", 1, ["experiment_path", "filesystem", "total_num_samples"]),
        ("start", ok, 1, int),
        ("result", ok, 1.0),
        ("checkpoint", ok, "checkpoint_000001"),
        ("result", ok, 2.0),
        ("checkpoint", ok, "checkpoint_000002"),
        ("complete", ok),
        ("start", bad, 2, int),
        ("error", bad),
    ]
    assert lumos_style.events == [("result", ok, 1.0), ("result", ok, 2.0)]
    assert logger.events == [
        ("start", ok, "_objective"),
        ("result", ok, 1.0, True),
        ("result", ok, 2.0, True),
        ("end", ok, False),
        ("start", bad, "_objective"),
        ("end", bad, True),
    ]
