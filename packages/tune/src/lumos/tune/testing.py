"""Test helpers: a scripted, deterministic trial executor (no Ray, no threads).

:class:`ScriptedExecutor` stands in for the Ray-backed executor under the
controller. Each trial follows a script -- a function of the trial's spec that
returns the steps the trial takes (report, raise, die) -- and every ``poll``
advances each running trial by one step, so tests can reason about
concurrency, pruning, stop criteria and retries exactly.

Example:
    >>> def script(spec):
    ...     return [report({"loss": 1.0}), report({"loss": 0.5})]
    >>> executor = ScriptedExecutor(script)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lumos.storage import CheckpointRecord, RunState, RunStorage, retried_write
from lumos.tune._internal.errors import TrialErrorRecord
from lumos.tune._internal.executor import Failed, Finished, Reported, TrialEvent
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.trial_spec import TrialSpec

__all__ = ["ScriptedExecutor", "Step", "die", "fail", "hang", "report"]


@dataclass(frozen=True)
class Step:
    """One step of a scripted trial.

    Attributes:
        kind: ``"report"``, ``"fail"`` (the function raises), ``"die"`` (the actor dies)
            or ``"hang"`` (no more events, stops ignored).
        metrics: Metrics of a report.
        checkpoint: Whether the report carries a checkpoint.
        message: Error message of a failure.
    """

    kind: str
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint: bool = False
    message: str = ""


def report(metrics: dict[str, Any], checkpoint: bool = False) -> Step:
    """A ``tune.report(metrics)`` step (with a checkpoint when ``checkpoint``)."""
    return Step("report", dict(metrics), checkpoint)


def fail(message: str = "boom") -> Step:
    """The trial function raises ``RuntimeError(message)``."""
    return Step("fail", message=message)


def hang() -> Step:
    """The trial stops responding: no more events, stop requests are ignored."""
    return Step("hang")


def die(message: str = "actor died") -> Step:
    """The trial's actor dies."""
    return Step("die", message=message)


@dataclass
class _Running:
    spec: TrialSpec
    steps: list[Step]
    pos: int = 0
    iteration: int = 0
    stop: bool = False


class ScriptedExecutor:
    """Runs scripted trials; one step per running trial per :meth:`poll`.

    Args:
        script: ``spec -> list[Step]``; the trial returns after its last step. It is
            called again for every attempt (``spec.attempt``, ``spec.checkpoint_dir``
            and ``spec.start_iteration`` tell a retry from a first run).
        capacity: At most this many trials are placed; later ones wait "for resources".
        storage: The experiment's storage. When given, a report with a checkpoint
            really commits one (a small file, ``RunStorage.commit_checkpoint``) in the
            trial's directory, as ``tune.report`` does; population-based training
            clones such checkpoints.

    Attributes:
        started: Every spec launched, in order.
        stopped: Trial ids the controller asked to stop, in order.
        killed: Trial ids the controller killed.
        kept: Trial ids whose worker the controller asked to keep for a relaunch.
        answers: ``(trial_id, go)`` the controller sent to waiting reports.
        max_running: Most trials running at once.
    """

    def __init__(
        self,
        script: Callable[[TrialSpec], list[Step]],
        capacity: int | None = None,
        storage: RunStorage | None = None,
    ) -> None:
        self.script = script
        self.storage = storage
        self.capacity = capacity
        self.started: list[TrialSpec] = []
        self.stopped: list[str] = []
        self.killed: list[str] = []
        self.kept: list[str] = []
        self.answers: list[tuple[str, bool]] = []
        self.max_running = 0
        self.polls = 0
        self._running: dict[str, _Running] = {}

    @property
    def num_running(self) -> int:
        return len(self._running)

    def start(self, spec: TrialSpec) -> None:
        self.started.append(spec)
        self._running[spec.trial_id] = _Running(
            spec, list(self.script(spec)), iteration=spec.start_iteration
        )
        self.max_running = max(self.max_running, len(self._running))

    def stop(self, trial_id: str) -> list[TrialEvent]:
        self.stopped.append(trial_id)
        if trial_id in self._running:
            self._running[trial_id].stop = True
        return []

    def answer(self, trial_id: str, go: bool) -> None:
        self.answers.append((trial_id, go))

    def keep_worker(self, trial_id: str) -> None:
        self.kept.append(trial_id)

    def kill(self, trial_id: str) -> None:
        self.killed.append(trial_id)
        self._running.pop(trial_id, None)

    def waiting_for_resources(self) -> list[str]:
        if self.capacity is None:
            return []
        return list(self._running)[self.capacity :]

    def release_idle(self, keep: int) -> None:
        return None

    def _commit(self, run: _Running, dir_name: str, metrics: dict[str, Any]) -> None:
        assert self.storage is not None
        trial = self.storage.child(run.spec.directory)
        path = trial.checkpoint_path(dir_name)
        content = json.dumps({"config": run.spec.config, "iteration": run.iteration})
        retried_write(trial.fs, f"{path}/state.json", content.encode())
        state = trial.load_state() or RunState(name=run.spec.directory)
        record = CheckpointRecord(dir_name=dir_name, metrics=metrics, report_index=run.iteration)
        trial.commit_checkpoint(state, record)

    def poll(self, timeout_s: float | None) -> list[TrialEvent]:
        self.polls += 1
        events: list[TrialEvent] = []
        placed = list(self._running.values())
        if self.capacity is not None:
            placed = placed[: self.capacity]
        for run in placed:
            tid = run.spec.trial_id
            if run.pos >= len(run.steps):
                events.append(Finished(tid, pruned=False))
                del self._running[tid]
                continue
            step = run.steps[run.pos]
            if step.kind == "hang":
                continue
            run.pos += 1
            if step.kind == "report":
                if run.stop:
                    events.append(Finished(tid, pruned=True, message="stopped"))
                    del self._running[tid]
                    continue
                run.iteration += 1
                metrics = {**step.metrics, ITERATION_KEY: run.iteration}
                ckpt = f"checkpoint_{run.iteration:06d}" if step.checkpoint else None
                if ckpt is not None and self.storage is not None:
                    self._commit(run, ckpt, metrics)
                events.append(Reported(tid, run.iteration, metrics, ckpt))
            elif step.kind == "fail":
                err = TrialErrorRecord(
                    run.spec.trial_name, run.spec.attempt, "RuntimeError", step.message
                )
                events.append(Failed(tid, err))
                del self._running[tid]
            elif step.kind == "die":
                err = TrialErrorRecord(
                    run.spec.trial_name, run.spec.attempt, "WorkerDied", step.message
                )
                events.append(Failed(tid, err, worker_lost=True))
                del self._running[tid]
            else:  # pragma: no cover - guarded by the constructors above
                raise ValueError(f"unknown step kind {step.kind!r}")
        return events
