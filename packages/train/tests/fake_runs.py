"""Helpers for the controller tests: trainers on ``FakeCluster``, a recording callback."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import run_config

from lumos import train
from lumos.runtime import WorkerFailure
from lumos.runtime.context import JobContext
from lumos.runtime.testing import FakeCluster


def make(
    fn: Any,
    config: dict[str, Any] | None,
    tmp_path: Path,
    cluster: FakeCluster,
    *,
    workers: int = 2,
    name: str = "run",
    **run_kwargs: Any,
) -> train.DataParallelTrainer:
    return train.DataParallelTrainer(
        fn,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=workers),
        run_config=run_config(tmp_path, name, **run_kwargs),
        _group_factory=cluster.start,
    )


def states(trainer: train.DataParallelTrainer) -> list[str]:
    assert trainer._last_controller is not None
    return [s.name for s in trainer._last_controller.history]


class Recorder(train.Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_report(self, metrics: dict[str, Any], checkpoint: train.Checkpoint | None) -> None:
        self.calls.append(("report", (metrics.get("step", metrics.get("i")), checkpoint)))

    def on_failure(self, failures: list[WorkerFailure], will_restart: bool) -> None:
        self.calls.append(("failure", ([(f.rank, f.kind) for f in failures], will_restart)))

    def on_restart(self, attempt: int, checkpoint: train.Checkpoint | None) -> None:
        self.calls.append(("restart", (attempt, checkpoint)))

    def on_finish(self, result: train.Result | None, error: BaseException | None) -> None:
        self.calls.append(("finish", (result is not None, type(error).__name__ if error else None)))


def trial_context(tmp_path: Path, report: Any, stop_event: threading.Event) -> JobContext:
    return JobContext(
        kind="tune.trial",
        name="trial_0",
        storage_path=str(tmp_path / "trial_0"),
        storage_filesystem=None,
        report=report,
        stop_event=stop_event,
        stop_error=lambda: KeyError("pruned by the parent"),
    )
