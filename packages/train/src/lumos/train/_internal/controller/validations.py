"""Driver side of asynchronous validation: one Ray task per validated checkpoint.

The controller submits a committed checkpoint's validation; ``ValidationRunner``
starts at most ``MAX_VALIDATIONS_IN_FLIGHT`` tasks at a time (the rest wait in
order), cancels a task that exceeds its ``timeout_s`` and hands every ended
validation back as an :class:`Outcome` from :meth:`ValidationRunner.poll`. Training
never waits for it; only the end of the run does.

How a task runs is a :class:`ValidationLauncher`: ``RayValidationLauncher`` (a
``ray.remote`` task with the config's ``ray_remote_kwargs``) or, in unit tests,
``ThreadValidationLauncher``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lumos.train._internal.validation import ValidationFn, run_validation, warm_up

if TYPE_CHECKING:
    from lumos.storage import Checkpoint

MAX_VALIDATIONS_IN_FLIGHT = 2
"""Validations that run at once; later ones wait (in report order) for a free slot.
Ray Train V2 runs one at a time; two keep up with a validation that takes longer than
the interval between checkpoints without taking over the cluster."""

_POLL_EVERY_S = 0.05
"""A non-blocking poll looks at the tasks at most this often (the controller polls on
every batch of worker events)."""


@dataclass(frozen=True)
class Outcome:
    """An ended validation.

    Attributes:
        index: The report index of the validated checkpoint.
        dir_name: Its directory name.
        status: ``"validated"``, ``"timeout"`` or ``"failed"``.
        metrics: The validation's metrics (``{}`` unless validated).
        error: Why it failed or timed out.
    """

    index: int
    dir_name: str
    status: Literal["validated", "timeout", "failed"]
    metrics: dict[str, Any]
    error: str | None = None


class ValidationLauncher(Protocol):
    """Starts validation tasks and reports on them (Ray, or threads in unit tests)."""

    def launch(self, checkpoint: Checkpoint, fn_kwargs: dict[str, Any]) -> Any:
        """Start one validation; returns its handle."""

    def done(self, handles: list[Any], timeout_s: float) -> list[Any]:
        """The handles that ended, waiting up to ``timeout_s`` for a first one."""

    def result(self, handle: Any) -> dict[str, Any]:
        """The metrics of an ended validation; raises its error."""

    def cancel(self, handle: Any) -> None:
        """Stop a running validation (best effort)."""


class RayValidationLauncher:
    """Each validation is a Ray task with the config's ``ray_remote_kwargs``.

    Args:
        fn: The validation function (put in the object store once).
        ray_remote_kwargs: ``ray.remote`` options of the task.
    """

    def __init__(self, fn: ValidationFn, ray_remote_kwargs: dict[str, Any]) -> None:
        import ray

        self._fn_ref = ray.put(fn)
        self._task = ray.remote(run_validation).options(**ray_remote_kwargs)
        # A task's first run starts a worker process and imports lumos and the function
        # (seconds); do it now, while the training group starts, in as many processes
        # as validations run at once. Ray keeps idle task workers for reuse.
        warm = ray.remote(warm_up).options(**ray_remote_kwargs)
        self._warm = [warm.remote(self._fn_ref) for _ in range(MAX_VALIDATIONS_IN_FLIGHT)]

    def launch(self, checkpoint: Checkpoint, fn_kwargs: dict[str, Any]) -> Any:
        return self._task.remote(self._fn_ref, checkpoint, fn_kwargs)

    def done(self, handles: list[Any], timeout_s: float) -> list[Any]:
        import ray

        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout_s)
        if ready and len(handles) > 1:  # collect the others that ended too
            more, _ = ray.wait(handles, num_returns=len(handles), timeout=0)
            return list(more)
        return list(ready)

    def result(self, handle: Any) -> dict[str, Any]:
        import ray

        try:
            value: dict[str, Any] = ray.get(handle)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            raise (cause or exc) from None
        return value

    def cancel(self, handle: Any) -> None:
        import ray

        try:
            ray.cancel(handle, force=True)
        except Exception:  # pragma: no cover - the task ended meanwhile
            pass


class ThreadValidationLauncher:
    """Runs validations in threads of the driver (unit tests with a fake group).

    A cancelled validation keeps running in its thread; its result is ignored.
    """

    def __init__(self, fn: ValidationFn, max_workers: int = MAX_VALIDATIONS_IN_FLIGHT) -> None:
        self._fn = fn
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="lumos-validation")

    def launch(self, checkpoint: Checkpoint, fn_kwargs: dict[str, Any]) -> Any:
        return self._pool.submit(run_validation, self._fn, checkpoint, fn_kwargs)

    def done(self, handles: list[Any], timeout_s: float) -> list[Any]:
        from concurrent.futures import FIRST_COMPLETED, wait

        finished, _ = wait(handles, timeout=timeout_s, return_when=FIRST_COMPLETED)
        return [h for h in handles if h in finished]

    def result(self, handle: Any) -> dict[str, Any]:
        future: Future[dict[str, Any]] = handle
        return future.result()

    def cancel(self, handle: Any) -> None:
        handle.cancel()


@dataclass
class _Job:
    index: int
    dir_name: str
    checkpoint: Checkpoint
    fn_kwargs: dict[str, Any]
    timeout_s: float | None
    started: float = 0.0
    handle: Any = None


class ValidationRunner:
    """Queues, runs and times out the run's validations (see the module docstring).

    Args:
        launcher: How tasks start.
        max_in_flight: Validations that run at once.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        launcher: ValidationLauncher,
        max_in_flight: int = MAX_VALIDATIONS_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._launcher = launcher
        self._max = max_in_flight
        self._clock = clock
        self._queue: deque[_Job] = deque()
        self._running: list[_Job] = []
        self._ended: list[Outcome] = []  # could not start: reported at the next poll
        self._next_look = 0.0

    @property
    def pending(self) -> int:
        """Validations submitted and not ended (queued or running)."""
        return len(self._queue) + len(self._running) + len(self._ended)

    def submit(
        self, index: int, dir_name: str, checkpoint: Checkpoint, request: dict[str, Any]
    ) -> None:
        """Queue the validation of a committed checkpoint (``request``: the stored
        ``{"fn_kwargs", "timeout_s"}``); it starts as soon as a slot is free."""
        self._queue.append(
            _Job(
                index,
                dir_name,
                checkpoint,
                dict(request.get("fn_kwargs") or {}),
                request.get("timeout_s"),
            )
        )
        self._start_queued()

    def cancel(self, dir_names: set[str]) -> list[str]:
        """Drop the validations of these checkpoints (rolled back); returns those dropped."""
        dropped = [j.dir_name for j in self._queue if j.dir_name in dir_names]
        self._queue = deque(j for j in self._queue if j.dir_name not in dir_names)
        for job in [j for j in self._running if j.dir_name in dir_names]:
            self._launcher.cancel(job.handle)
            self._running.remove(job)
            dropped.append(job.dir_name)
        self._start_queued()
        return dropped

    def poll(self, timeout_s: float = 0.0) -> list[Outcome]:
        """The validations that ended (waiting up to ``timeout_s`` for one)."""
        now = self._clock()
        outcomes, self._ended = self._ended, []
        if not self._running or (timeout_s <= 0 and now < self._next_look):
            return outcomes
        self._next_look = now + _POLL_EVERY_S
        outcomes += self._time_out(now)
        if self._running:
            wait_s = 0.0 if outcomes else max(0.0, min(timeout_s, self._until_timeout(now)))
            ended = self._launcher.done([j.handle for j in self._running], wait_s)
            for job in [j for j in self._running if any(j.handle is h for h in ended)]:
                self._running.remove(job)
                outcomes.append(self._outcome(job))
        self._start_queued()
        return outcomes

    def shutdown(self) -> None:
        """Cancel everything (the run ends without them: they run again on resume)."""
        for job in self._running:
            self._launcher.cancel(job.handle)
        self._running.clear()
        self._queue.clear()

    def _until_timeout(self, now: float) -> float:
        left = [j.started + j.timeout_s - now for j in self._running if j.timeout_s is not None]
        return min(left) if left else float("inf")

    def _time_out(self, now: float) -> list[Outcome]:
        out: list[Outcome] = []
        for job in list(self._running):
            if job.timeout_s is not None and now - job.started >= job.timeout_s:
                self._launcher.cancel(job.handle)
                self._running.remove(job)
                error = f"the validation did not end within timeout_s={job.timeout_s:g}"
                out.append(Outcome(job.index, job.dir_name, "timeout", {}, error))
        return out

    def _outcome(self, job: _Job) -> Outcome:
        try:
            metrics = self._launcher.result(job.handle)
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            return Outcome(job.index, job.dir_name, "failed", {}, error)
        return Outcome(job.index, job.dir_name, "validated", dict(metrics))

    def _start_queued(self) -> None:
        while self._queue and len(self._running) < self._max:
            job = self._queue.popleft()
            try:
                job.handle = self._launcher.launch(job.checkpoint, job.fn_kwargs)
            except Exception as exc:  # e.g. ray_remote_kwargs Ray refuses
                error = f"could not start the validation task: {type(exc).__name__}: {exc}"
                self._ended.append(Outcome(job.index, job.dir_name, "failed", {}, error))
                continue
            job.started = self._clock()
            self._running.append(job)
