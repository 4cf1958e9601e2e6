"""Ray Tune's class API (tune.Trainable) in-process (runtime's FakeWorkerPool, no Ray)."""

from __future__ import annotations

import os
from typing import Any

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool


def fake_pool(resources: dict[str, float]) -> FakeWorkerPool:
    return FakeWorkerPool(resources)


class Counter(tune.Trainable):
    def setup(self, config: dict[str, Any], offset: float = 0.0) -> None:
        self.x = offset
        self.fail_at = config.get("fail_at")

    def step(self) -> dict[str, Any]:
        self.x += self.config["lr"]
        if self.fail_at == self.iteration + 1 and tune.get_context().get_attempt() == 0:
            raise RuntimeError("boom")
        return {"loss": -self.x, "x": self.x, "done": self.iteration + 1 >= 6}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"x": self.x}

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        assert isinstance(checkpoint, dict)
        self.x = checkpoint["x"]


class DirCounter(Counter):
    checkpoint_frequency = 2

    def save_checkpoint(self, checkpoint_dir: str) -> None:  # type: ignore[override]
        with open(os.path.join(checkpoint_dir, "x"), "w") as f:
            f.write(repr(self.x))

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        assert isinstance(checkpoint, str)
        with open(os.path.join(checkpoint, "x")) as f:
            self.x = float(f.read())


def _fit(tmp_path: Any, trainable: Any, name: str, **tc: Any) -> tune.ResultGrid:
    return tune.Tuner(
        trainable,
        param_space={"lr": tune.choice([1.0]), "fail_at": 4},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=1, **tc),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
        ),
        _pool_factory=fake_pool,
    ).fit()


def test_a_trainable_class_steps_checkpoints_and_resumes_after_a_failure(tmp_path: Any) -> None:
    for cls, name in ((Counter, "dict"), (DirCounter, "dir")):
        grid = _fit(tmp_path, cls, name)
        (result,) = grid
        assert result.status == "TERMINATED"
        assert result.errors, "the first attempt failed at step 4"
        rows = result.metrics_dataframe
        # resumed from the checkpoint after step 3 (dict) or step 2 (every 2 steps)
        assert list(rows["training_iteration"]) == [1, 2, 3, 4, 5, 6]
        assert list(rows["x"]) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        assert result.checkpoint is not None
        assert grid.get_best_result().metrics["x"] == 6.0


def test_stop_criteria_end_a_trainable_without_done(tmp_path: Any) -> None:
    class Forever(tune.Trainable):
        def step(self) -> dict[str, Any]:
            return {"loss": 1.0}

    (result,) = _fit(tmp_path, Forever, "forever", stop={"training_iteration": 3})
    assert result.status == "TERMINATED"
    assert result.metrics["training_iteration"] == 3
    assert result.checkpoint is None  # it saves nothing


def test_with_parameters_objects_reach_setup(tmp_path: Any, monkeypatch: Any) -> None:
    from lumos.tune._internal.wrappers import SharedObjects, parameters_class

    shared = SharedObjects({})
    shared.values = {"offset": 100.0}  # as fetched from the object store
    wrapped = parameters_class(Counter, shared)
    assert issubclass(wrapped, Counter)
    assert wrapped.__name__ == "Counter"
    grid = _fit(tmp_path, wrapped, "params")
    assert grid[0].metrics["x"] == 106.0
