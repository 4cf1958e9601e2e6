"""Local mode: ``ScalingConfig(num_workers=0)`` runs the training function in this process.

No Ray: the function runs in the thread that called ``fit()`` (a debugger steps
straight into it) as one rank with the worker-side ``TrainSession`` of every run, so
``train.report`` / ``get_checkpoint`` / ``get_context`` /
``get_all_reported_checkpoints`` behave as on a Ray worker. The driver side is the
same ``RunCore`` (``controller/core.py``) the Ray controller drives, called
synchronously from the session's messages: it commits (run state, retention,
loader positions), writes the metrics history, runs validations (in a thread of this
process: ``ValidationConfig.ray_remote_kwargs`` do not apply) and the health checks.
A check that fires stops the function at its next ``train.report()`` (``StopRequested``,
as on a Ray worker) and runs it again from the rollback's checkpoint, with
``train.get_context().get_rollback_info()`` set. A rerun with the same
``RunConfig(storage_path, name)`` resumes from the latest committed checkpoint; local
mode does not retry a failed function itself (``torchrun --max-restarts`` does).

Under ``torchrun`` every process is one rank of the run (``local_exchange.py``). At
every ``train.report()`` the ranks gather their messages; rank 0 alone holds the
run's lease and the ``RunCore``, and broadcasts what came of the round (the notices
for every rank's session, the uploads still in flight, an error or a rollback), so
every rank acts on the same outcome. Each rank writes its own checkpoint files into
the run's ``<checkpoint_dir_name>`` (sharded checkpoints), as on Ray. Ray Train's
local mode, by contrast, keeps only the last checkpoint object in memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from lumos.runtime import StopRequested, WorkerInfo, WorkerSession
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.core import RunCore
from lumos.train._internal.controller.seam import RollbackRequest, RunBroken, Verdict
from lumos.train._internal.datasets import DataHooks
from lumos.train._internal.errors import CheckpointReportError, TrainError, TrainingFailedError
from lumos.train._internal.local_exchange import (
    Exchange,
    env,
    open_exchange,
    portable,
    share,
    worker_info,
)
from lumos.train._internal.local_hang import watching
from lumos.train._internal.result import Result, result_from_state
from lumos.train._internal.session import run_in_session
from lumos.train._internal.wire import RankReport, UploadDone, decode

if TYPE_CHECKING:
    from lumos.storage import RunState, RunStorage
    from lumos.train._internal.console import Console
    from lumos.train._internal.controller.health_monitor import Fired
    from lumos.train._internal.controller.spec import RunSpec
    from lumos.train._internal.train_context import WorkerRunArgs

T = TypeVar("T")


@dataclass(frozen=True)
class LocalSpec:
    """What one local-mode ``fit()`` runs (built by ``DataParallelTrainer.fit``).

    Attributes:
        run: What every backend shares.
        open_state: Loads (and cleans up) or creates the run's state; rank 0 calls it
            while it holds the run's lease.
        process_group_backend: The backend of the default process group joined under
            torchrun (``"gloo"`` or ``"nccl"``).
        use_gpu: Give the rank its local GPU (``torch.cuda.set_device(local_rank)``).
        dataset_shards: The trainer's datasets split for a world size (one
            ``{name: shard}`` per rank), or ``None`` without ``datasets=``.
        hang_timeout_s: ``FailureConfig(hang_timeout_s)`` (``local_hang.py``).
    """

    run: RunSpec
    open_state: Callable[[RunStorage, Console], RunState]
    process_group_backend: str
    use_gpu: bool
    dataset_shards: Callable[[int], list[dict[str, Any]]] | None = None
    hang_timeout_s: float | None = None


# -- one round: what each rank brings, and what rank 0 makes of it --------------------
@dataclass
class _Round:
    """What one rank brings to one exchange."""

    report: tuple[Any, ...] | None  # its train.report() message, if this round is one
    uploads: list[tuple[Any, ...]] = field(default_factory=list)  # "u"/"uf" since the last
    ended: bool = False  # its training function returned


@dataclass
class _Outcome:
    """What rank 0's ``RunCore`` made of a round (the same on every rank)."""

    notices: list[tuple[Any, ...]] = field(default_factory=list)  # for every rank's session
    in_flight: list[int] = field(default_factory=list)  # complete, uploads still running
    error: BaseException | None = None  # every rank raises it
    rollback: bool = False  # a health check fired: every rank's function stops
    outstanding: int = 0  # validations the run still waits for


class _LocalSession(WorkerSession):
    """The runtime session of a local rank: a blocking ``receive()`` drives the driver.

    A rank waits for a commit or validation notice in ``receive()`` (a SYNC report,
    ``get_all_reported_checkpoints``). Alone, the driver commits finished background
    (ASYNC) uploads and polls validations here, in the training thread, until the
    notice is there. Under torchrun no rank can do that alone, so a wait that no
    exchange will answer is an error that says so.
    """

    def __init__(self, info: WorkerInfo, driver: LocalDriver) -> None:
        super().__init__(info, None, driver)
        self._driver = driver

    def emit(self, payload: Any) -> None:
        # Straight to the driver, without the base class's lock: a SYNC report may wait
        # in the driver for this rank's ASYNC uploads, whose threads emit too.
        self._driver.put(("R", -1, payload))

    def receive(self, timeout_s: float | None = None) -> Any:
        if timeout_s == 0.0:
            return super().receive(0.0)
        return self._driver.wait_for_notice(
            lambda: super(_LocalSession, self).receive(0.0), timeout_s
        )


class LocalDriver:
    """The driver side of a local rank for one attempt: the session's outbox and rounds.

    Args:
        exchange: How the ranks share their messages.
        core: The run core (rank 0; ``None`` on the other ranks).
        outbox: Where the core's notices collect until the round's end.
        poll_s: How long one wait for validations lasts.
    """

    def __init__(
        self,
        exchange: Exchange,
        core: RunCore | None,
        outbox: list[tuple[Any, ...]],
        poll_s: float,
    ) -> None:
        self._exchange = exchange
        self._core = core
        self._outbox = outbox
        self._poll_s = poll_s
        self._cond = threading.Condition(threading.Lock())
        self._uploads: list[tuple[Any, ...]] = []  # this rank's upload outcomes, not exchanged
        self._my_pending: set[int] = set()  # this rank's ASYNC uploads still running
        self.session: _LocalSession | None = None
        self.fired: Fired | None = None  # rank 0: the check that fired
        self.rolling_back = False  # every rank: a check fired, the function stops

    # -- Outbox: every message of the session arrives here --------------------------------
    def put(self, item: tuple[str, int, Any]) -> None:
        """Take one message of the session (its ``emit``); runs the driver's side of it."""
        payload = item[2]
        decoded = decode(payload)
        if decoded is None:  # pragma: no cover - local mode sends only wire messages
            raise RuntimeError(f"lumos.train local mode: unexpected message {payload!r}")
        message = decoded[1]
        if isinstance(message, UploadDone):  # from the upload thread: the next round takes it
            with self._cond:
                self._uploads.append(payload)
                self._my_pending.discard(message.index)
                self._cond.notify_all()
            return
        if message.upload_pending:
            with self._cond:
                self._my_pending.add(message.index)
        self._settle(*self._round(_Round(payload)))

    def wait_for_notice(self, take: Callable[[], Any], timeout_s: float | None) -> Any:
        """``take()`` a notice; alone, commit finished uploads and poll validations until
        one is there."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(TimeoutError):
                return take()
            if self._exchange.world_size > 1:
                raise CheckpointReportError(messages.TORCHRUN_WAIT_TEXT)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no checkpoint notice within {timeout_s} s")
            wait = self._poll_s if remaining is None else min(remaining, self._poll_s)
            validating = self._core is not None and self._core.outstanding() > 0
            with self._cond:
                if not self._uploads and not validating:
                    self._cond.wait(wait)
            self._round(_Round(None), idle_s=0.0 if self._uploads else wait)

    def finish(self) -> None:
        """The function returned: the last rounds (last uploads, validations still running)."""
        outcome, _ = self._round(_Round(None, ended=True))
        said = False
        while outcome.outstanding and not self.rolling_back:
            if self._core is not None and not said:
                said = True
                self._core.training_finished(outcome.outstanding)
            outcome, _ = self._round(_Round(None, ended=True), idle_s=self._poll_s)

    # -- rounds ------------------------------------------------------------------------
    def _settle(self, outcome: _Outcome, sync: list[int]) -> None:
        """Exchange until the commits a SYNC report waits for are out.

        ``sync`` comes from the round every rank saw and ``in_flight`` from rank 0, so
        all ranks agree on how many more rounds they take: each waits for its own
        earlier ASYNC uploads (a commit waits for those before it), then brings their
        outcome to the next round.
        """
        while blocking := [i for i in sync if i in outcome.in_flight]:
            with self._cond:
                self._cond.wait_for(partial(self._uploaded_up_to, max(blocking)))
            outcome, _ = self._round(_Round(None))

    def _uploaded_up_to(self, index: int) -> bool:
        return not any(i <= index for i in self._my_pending)

    def _round(self, mine: _Round, idle_s: float = 0.0) -> tuple[_Outcome, list[int]]:
        """One exchange; returns its outcome and the reports whose SYNC ranks wait."""
        with self._cond:
            mine.uploads, self._uploads = self._uploads, []
        rounds: list[_Round] = self._exchange.gather(mine)
        reports = [(rank, _report(r.report)) for rank, r in enumerate(rounds) if r.report]
        sync = [
            rep.index for _, rep in reports if rep.checkpoint_dir_name and not rep.upload_pending
        ]
        outcome = self._process(rounds, idle_s) if self._core is not None else _Outcome()
        if self._exchange.world_size > 1:
            shared = self._exchange.broadcast(
                _Outcome(outcome.notices, outcome.in_flight, portable(outcome.error),
                         outcome.rollback, outcome.outstanding)
            )  # fmt: skip
            outcome = outcome if self._core is not None else shared
        assert self.session is not None
        for notice in outcome.notices:
            self.session.deliver(notice)
        if outcome.error is not None:
            raise outcome.error
        if outcome.rollback:  # the function stops at its next report, as on a Ray worker
            self.rolling_back = True
            self.session.request_stop()
        return outcome, sync

    def _process(self, rounds: list[_Round], idle_s: float) -> _Outcome:
        """Rank 0: feed the round to the run core; what came of it."""
        core = self._core
        assert core is not None
        ended = [r for r, x in enumerate(rounds) if x.ended]
        if ended and len(ended) < len(rounds):
            still = [r for r, x in enumerate(rounds) if not x.ended]
            return _Outcome(error=CheckpointReportError(messages.uneven_ranks_text(ended, still)))
        verdict: Verdict | None = None
        failed: dict[int, BaseException] = {}
        for rank, r in enumerate(rounds):
            if r.report is not None and verdict is None:
                verdict = core.on_report(rank, _report(r.report))
            for upload in r.uploads:
                _, done = decode(upload) or (0, None)
                assert isinstance(done, UploadDone)
                if done.error is not None:
                    failed[rank] = done.error
                elif verdict is None:
                    verdict = core.on_uploaded(rank, done.index)
            if r.ended:
                verdict = verdict or core.on_rank_ended(rank, returned=True)
        if verdict is None and not failed:
            verdict = core.idle(idle_s)  # validations
        core.tick()
        error = _error_of(core, verdict, failed)
        rollback = error is None and isinstance(verdict, RollbackRequest)
        if isinstance(verdict, RollbackRequest):
            self.fired = verdict.fired
        notices, self._outbox[:] = list(self._outbox), []
        in_flight = core.attempt.reports.in_flight()
        return _Outcome(notices, in_flight, error, rollback, core.outstanding())


def _report(message: tuple[Any, ...] | None) -> RankReport:
    _, report = decode(message) or (0, None)
    assert isinstance(report, RankReport)
    return report


def _error_of(
    core: RunCore, verdict: Verdict | None, failed: dict[int, BaseException]
) -> BaseException | None:
    """What every rank raises after a round (``None``: training goes on)."""
    if failed:
        return core.failed_error(messages.upload_failed_text(sorted(failed)), failed)
    stop = core.parent_stop()
    if stop is not None:
        return stop
    if isinstance(verdict, RunBroken):  # a misuse reaches the function as it is
        error = verdict.error
        return error if isinstance(error, TrainError) else core.broken_error(verdict)
    return None


# -- the run -----------------------------------------------------------------------------
def run_local(spec: LocalSpec) -> Result:
    """Run the training function in this process (one rank, or torchrun's ranks).

    Returns:
        The run's ``Result``, the same on every rank.

    Raises:
        Whatever the training function raised (local mode does not retry in the
        process; rerun ``fit()``, or use ``torchrun --max-restarts``, to resume from
        the latest committed checkpoint).
    """
    run = spec.run
    exchange = open_exchange(spec.process_group_backend, spec.use_gpu)
    try:
        with contextlib.ExitStack() as lease:

            def open_state() -> RunState:
                lease.enter_context(run.storage.leased())
                return spec.open_state(run.storage, run.console)

            state = share(exchange, exchange.rank == 0, open_state)
            if state.status == "finished":
                if exchange.rank == 0:
                    run.console.info(
                        messages.already_finished_line(
                            run.storage.name, run.storage.uri, state.updated_at
                        )
                    )
                return result_from_state(run.storage, state, metrics=None)
            with watching(run, exchange, spec.hang_timeout_s) as hang:
                return _LocalRun(spec, exchange, state, hang).run()
    finally:
        exchange.close()


class _LocalRun:
    """The attempts of one local run: start, launch, roll back, finish or fail."""

    def __init__(
        self, spec: LocalSpec, exchange: Exchange, state: RunState, hang: tuple[Any, ...] = ()
    ) -> None:
        self._spec = spec
        self._exchange = exchange
        self._outbox: list[tuple[Any, ...]] = []
        core = RunCore(spec.run, state, self._outbox.append, hang) if exchange.rank == 0 else None
        for component in hang:  # the hang watchdog's thread (local_hang.py)
            component.bind(core)
        self._core = core
        self._next = len(state.attempts)
        self._resume = state.latest()
        self._rolled_back_at: float | None = None
        self._result: Result | None = None  # rank 0's, once finished

    def run(self) -> Result:
        core = self._core
        try:
            self._on_rank0(self._start)
            driver = self._attempt()
            while driver.rolling_back:
                self._exchange.gather(None)  # every rank's function ended: nothing writes
                self._on_rank0(partial(self._roll_back, driver))
                driver = self._attempt()
            final = self._on_rank0(self._finish)
        except BaseException as exc:
            if core is not None:
                stopped = core.stopped_from_outside(exc)
                alone = self._exchange.world_size == 1  # nobody writes any more
                core.close_failed(exc, aborted=stopped, clean=alone)
            raise
        if core is None or self._result is None:
            return result_from_state(self._spec.run.storage, final, metrics=None)
        return core.close(self._result)

    def _on_rank0(self, fn: Callable[[], T]) -> T:
        return share(self._exchange, self._core is not None, fn)

    def _rank0(self) -> RunCore:
        assert self._core is not None, "rank 0's work"
        return self._core

    def _start(self) -> None:
        core = self._rank0()
        self._resume = core.start()
        core.console.info(messages.local_line(self._exchange.world_size))

    def _begin(self) -> WorkerRunArgs:
        core = self._rank0()
        args = core.begin_attempt(self._next, self._exchange.world_size, self._resume)
        if self._rolled_back_at is not None:
            seconds = time.monotonic() - self._rolled_back_at
            self._rolled_back_at = None
            core.console.info(messages.rolled_back_line(self._resume, seconds))
        return args

    def _attempt(self) -> LocalDriver:
        """One launch of the training function, to its end or a rollback."""
        spec, exchange = self._spec, self._exchange
        args = self._on_rank0(self._begin)
        self._next += 1
        driver = LocalDriver(exchange, self._core, self._outbox, spec.run.settings.poll_interval_s)
        session = _LocalSession(worker_info(exchange, spec.use_gpu), driver)
        driver.session = session
        shards = spec.dataset_shards
        hooks = DataHooks(None, shards(exchange.world_size)) if shards is not None else None
        try:
            if not args.training_done:  # else an earlier run trained: finish what is left
                with env("LUMOS_TRAIN_RUN_NAME", spec.run.storage.name):
                    run_in_session(session, spec.run.train_fn, spec.run.config, args, hooks)
            if not driver.rolling_back:  # (a function may have caught StopRequested)
                driver.finish()
        except StopRequested:
            if not driver.rolling_back:
                raise
        return driver

    def _roll_back(self, driver: LocalDriver) -> None:
        """Rank 0: carry out the rollback a health check asked for (or fail the run)."""
        core = self._rank0()
        assert driver.fired is not None
        plan = core.plan_rollback(driver.fired)
        if isinstance(plan, TrainingFailedError):
            raise plan
        self._resume = core.roll_back(plan)
        core.delete_uncommitted()  # uploads of the abandoned reports
        self._rolled_back_at = plan.since

    def _finish(self) -> RunState:
        """Rank 0: the run is finished; its final state (every rank's result reads it)."""
        core = self._rank0()
        self._result = core.finish()
        return core.book.state
