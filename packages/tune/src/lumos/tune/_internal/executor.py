"""Runs trials on a pool of reused workers (``lumos.runtime.WorkerPool`` or its fake).

The executor maps trials to pool workers and pool events to trial events; it
makes no decisions (the controller does). One trial runs on a worker at a time;
an idle worker takes the next trial, so actors (and the shipped function) are
reused for the whole sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lumos.runtime import (
    ErrorEvent,
    FinishedEvent,
    RemoteError,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
    WorkerPoolProtocol,
)
from lumos.tune._internal.errors import TrialErrorRecord
from lumos.tune._internal.session import GO, PRUNED, STOP
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune._internal.wrappers import resource_shape


@dataclass(frozen=True)
class Reported:
    """A trial reported (``iteration``, ``metrics``, committed ``checkpoint_dir``);
    ``awaiting``: it waits for :meth:`PoolExecutor.answer` before going on."""

    trial_id: str
    iteration: int
    metrics: dict[str, Any]
    checkpoint_dir: str | None
    awaiting: bool = False


@dataclass(frozen=True)
class Finished:
    """A trial's function returned; ``pruned`` when it ended by ``TrialPruned``."""

    trial_id: str
    pruned: bool
    message: str | None = None


@dataclass(frozen=True)
class Failed:
    """A trial's function raised, or its actor died / hung (``worker_lost``)."""

    trial_id: str
    error: TrialErrorRecord
    worker_lost: bool = False


@dataclass(frozen=True)
class Cancelled:
    """A trial that was waiting for a worker was stopped before it ever ran."""

    trial_id: str


TrialEvent = Reported | Finished | Failed | Cancelled


_Shape = tuple[tuple[str, float], ...] | None


def _key(resources: dict[str, float] | None) -> _Shape:
    """A hashable resource shape (``None``: the pool's own)."""
    return None if resources is None else tuple(sorted(resources.items()))


def _short_type(exc_type: str) -> str:
    return exc_type.rsplit(".", 1)[-1]


class PoolExecutor:
    """Trials on reused pool workers.

    A trial is launched only on a worker that Ray has placed. While none is free
    the trial waits on a new worker that Ray may not be able to place yet
    ("waiting for resources"); whichever comes first -- that worker being placed
    or a running worker finishing its trial -- runs it. Unplaced workers left
    without a trial stay as spares, so a full cluster causes no actor churn.

    Args:
        pool: A ``WorkerPool`` (or ``lumos.runtime.testing.FakeWorkerPool``).
        runner: The callable launched for every trial (shipped once by the pool).
        available_resources: Returns the cluster's free resources (Ray:
            ``ray.available_resources``); a waiting trial counts as waiting for
            resources only when they do not cover ``resources``. None: always.
        resources: What one worker needs.
        resources_fn: ``config -> resources`` (``tune.with_resources(trainable, fn)``):
            each trial runs on a worker of its own shape. Trials of equal shapes reuse
            each other's workers; an idle worker of another shape is released to make
            room. ``None``: every worker has the pool's shape.
    """

    def __init__(
        self,
        pool: WorkerPoolProtocol,
        runner: Callable[..., Any],
        available_resources: Callable[[], dict[str, float]] | None = None,
        resources: dict[str, float] | None = None,
        resources_fn: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.pool = pool
        self.runner = runner
        self.available_resources = available_resources
        self.resources = dict(resources or {})
        self.resources_fn = resources_fn
        self._shape: dict[int, _Shape] = {}  # worker -> its resources (resources_fn only)
        self._idle: list[int] = []  # placed, no trial
        self._spare: list[int] = []  # not placed yet, no trial
        self._deferred: dict[int, TrialSpec] = {}  # not placed yet, trial waits on it
        self._trial_of: dict[int, TrialSpec] = {}  # launched
        self._worker_of: dict[str, int] = {}
        self._keep: set[str] = set()  # trials whose worker waits for their relaunch
        self._kept: dict[str, int] = {}  # trial id -> its stopped worker, held for it

    @property
    def num_running(self) -> int:
        """Trials started (launched or waiting for a worker) and not yet ended."""
        return len(self._trial_of) + len(self._deferred)

    def start(self, spec: TrialSpec) -> None:
        """Run one attempt of a trial on its kept worker, an idle one, or wait for one."""
        kept = self._kept.pop(spec.trial_id, None)
        if kept is not None:
            self._launch(kept, spec)
            return
        spec = self._with_shape(spec)
        key = _key(spec.resources)
        idle = self._take(self._idle, key)
        if idle is not None:
            self._launch(idle, spec)
            return
        if self._idle:  # only idle workers of other shapes: release one to make room
            self._drop(self._idle.pop(0))
        wid = self._take(self._spare, key)
        if wid is None:
            wid = self.pool.add_worker(spec.resources) if key else self.pool.add_worker()
            if key:
                self._shape[wid] = key
        self._deferred[wid] = spec
        self._worker_of[spec.trial_id] = wid
        self._launch_placed()

    def _with_shape(self, spec: TrialSpec) -> TrialSpec:
        if self.resources_fn is None or spec.resources is not None:
            return spec
        shape = resource_shape(self.resources_fn(dict(spec.config)), "with_resources(fn)")
        return dataclasses.replace(spec, resources=shape)

    def _take(self, workers: list[int], key: _Shape) -> int | None:
        """Take a worker of shape ``key`` out of ``workers`` (the last one), if any."""
        if self.resources_fn is None:
            return workers.pop() if workers else None  # one shape: any worker fits
        for i in range(len(workers) - 1, -1, -1):
            if self._shape.get(workers[i]) == key:
                return workers.pop(i)
        return None

    def _drop(self, wid: int) -> None:
        self._shape.pop(wid, None)
        self.pool.remove_worker(wid)

    def _launch(self, wid: int, spec: TrialSpec) -> None:
        self._trial_of[wid] = spec
        self._worker_of[spec.trial_id] = wid
        self.pool.launch(wid, self.runner, args=(spec,))

    def _is_placed(self, wid: int) -> bool:
        return self.pool.ready(wid)

    def _launch_placed(self) -> None:
        for wid in [w for w in self._deferred if self._is_placed(w)]:
            self._launch(wid, self._deferred.pop(wid))
        for wid in [w for w in self._spare if self._is_placed(w)]:
            self._spare.remove(wid)
            self._idle.append(wid)

    def _cancel_deferred(self, trial_id: str) -> bool:
        wid = self._worker_of.get(trial_id)
        if wid is None or wid not in self._deferred:
            return False
        del self._deferred[wid]
        del self._worker_of[trial_id]
        self._spare.append(wid)
        return True

    def answer(self, trial_id: str, go: bool) -> None:
        """Answer a report that waits (``Reported.awaiting``): go on, or stop at once."""
        wid = self._worker_of.get(trial_id)
        if wid is not None and wid in self._trial_of:
            self.pool.send(wid, GO if go else STOP)

    def keep_worker(self, trial_id: str) -> None:
        """Hold the trial's worker for it when its function ends by a stop request.

        The next :meth:`start` of that trial runs on the same actor (population-based
        training relaunches an exploited trial there). A trial that ends otherwise
        (returns on its own, raises) releases its worker as usual.
        """
        self._keep.add(trial_id)

    def stop(self, trial_id: str) -> list[TrialEvent]:
        """Ask a running trial to stop (its next ``tune.report`` raises TrialPruned).

        Returns:
            ``[Cancelled(trial_id)]`` when the trial had not been launched yet.
        """
        if self._cancel_deferred(trial_id):
            return [Cancelled(trial_id)]
        wid = self._worker_of.get(trial_id)
        if wid is not None:
            self.pool.request_stop(wid)
        return []

    def kill(self, trial_id: str) -> None:
        """End a trial at once by removing its worker (its events are dropped)."""
        self._keep.discard(trial_id)
        if self._cancel_deferred(trial_id):
            return
        wid = self._worker_of.pop(trial_id, None)
        if wid is not None:
            self._trial_of.pop(wid, None)
            self._drop(wid)

    def waiting_for_resources(self) -> list[str]:
        """Ids of trials waiting for a worker that Ray cannot place for lack of resources."""
        if not self._deferred:
            return []
        pending = set(self.pool.pending_workers())
        waiting = [s for w, s in self._deferred.items() if w in pending]
        if waiting and self.available_resources is not None:
            free = self.available_resources()
            # those the cluster has room for: their actors are just starting
            waiting = [
                s
                for s in waiting
                if not all(
                    free.get(k, 0.0) >= v for k, v in (s.resources or self.resources).items()
                )
            ]
        return [s.trial_id for s in waiting]

    def release_idle(self, keep: int) -> None:
        """Remove idle and spare workers beyond ``keep`` (nothing left to run on them)."""
        while self._spare:
            self._drop(self._spare.pop())
        while len(self._idle) > keep:
            self._drop(self._idle.pop(0))

    def poll(self, timeout_s: float | None) -> list[TrialEvent]:
        """Trial events, in order per trial; blocks up to ``timeout_s`` for the first."""
        out: list[TrialEvent] = []
        for ev in self.pool.poll(timeout_s):
            if ev.rank in self._deferred or ev.rank in self._spare:
                if isinstance(ev, (WorkerDiedEvent, WorkerHungEvent)):
                    out.extend(self._unplaced_worker_lost(ev))
                continue
            spec = self._trial_of.get(ev.rank)
            if spec is None:
                continue  # a killed trial's late event, or an idle worker's
            tid = spec.trial_id
            if isinstance(ev, ReportEvent):
                iteration, metrics, ckpt, *awaiting = ev.payload
                out.append(Reported(tid, iteration, metrics, ckpt, bool(awaiting)))
            elif isinstance(ev, FinishedEvent):
                result = ev.result
                pruned = ev.stopped or (isinstance(result, tuple) and result[:1] == (PRUNED,))
                self._release(ev.rank, tid, keep=pruned)
                message = result[1] if isinstance(result, tuple) and len(result) > 1 else None
                out.append(Finished(tid, pruned, message))
            elif isinstance(ev, ErrorEvent):
                self._release(ev.rank, tid)
                out.append(Failed(tid, _trial_error(spec, ev.error)))
            elif isinstance(ev, (WorkerDiedEvent, WorkerHungEvent)):
                self._keep.discard(tid)
                self._trial_of.pop(ev.rank, None)
                self._worker_of.pop(tid, None)
                self._drop(ev.rank)
                out.append(Failed(tid, _lost_error(spec, ev), worker_lost=True))
        if self._deferred or self._spare:
            self._launch_placed()
        return out

    def _unplaced_worker_lost(self, ev: WorkerDiedEvent | WorkerHungEvent) -> list[TrialEvent]:
        self._drop(ev.rank)
        if ev.rank in self._spare:
            self._spare.remove(ev.rank)
            return []
        spec = self._deferred.pop(ev.rank)
        self._worker_of.pop(spec.trial_id, None)
        return [Failed(spec.trial_id, _lost_error(spec, ev), worker_lost=True)]

    def _release(self, wid: int, tid: str, keep: bool = False) -> None:
        self._trial_of.pop(wid, None)
        self._worker_of.pop(tid, None)
        if tid in self._keep:
            self._keep.discard(tid)
            if keep:
                self._kept[tid] = wid
                return
        shape = self._shape.get(wid)
        waiting_on = next(
            (w for w, s in self._deferred.items() if _key(s.resources) == shape), None
        )
        if waiting_on is not None:
            # A trial waits on an unplaced worker: run it here; that worker becomes a spare.
            spec = self._deferred.pop(waiting_on)
            self._spare.append(waiting_on)
            self._launch(wid, spec)
        else:
            self._idle.append(wid)

    def shutdown(self, grace_period_s: float = 5.0) -> None:
        """Stop everything and release every actor."""
        self.pool.shutdown(grace_period_s=grace_period_s)
        self._idle.clear()
        self._spare.clear()
        self._deferred.clear()
        self._trial_of.clear()
        self._worker_of.clear()
        self._keep.clear()
        self._kept.clear()


def _lost_error(spec: TrialSpec, ev: WorkerDiedEvent | WorkerHungEvent) -> TrialErrorRecord:
    if isinstance(ev, WorkerDiedEvent):
        return TrialErrorRecord(
            spec.trial_name, spec.attempt, "WorkerDied", f"the trial's actor died: {ev.reason}"
        )
    return TrialErrorRecord(
        spec.trial_name,
        spec.attempt,
        "WorkerHung",
        f"the trial's actor did not answer its health check for {ev.waited_s:.1f}s",
    )


def _trial_error(spec: TrialSpec, err: RemoteError) -> TrialErrorRecord:
    return TrialErrorRecord(
        spec.trial_name, spec.attempt, _short_type(err.exc_type), err.message, err.traceback
    )
