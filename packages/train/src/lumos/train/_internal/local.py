"""Local mode: ``ScalingConfig(num_workers=0)`` runs the training function in this process.

No Ray: the function runs in the thread that called ``fit()`` (a debugger steps
straight into it) as one rank with the worker-side ``TrainSession`` of every run, so
``train.report`` / ``get_checkpoint`` / ``get_context`` /
``get_all_reported_checkpoints`` behave as on a Ray worker. The driver side is the
controller's own pieces, called synchronously from the session's messages:
``ReportAggregator`` decides commits, ``RunBook`` writes them through
``RunStorage.commit_checkpoint`` (run state, retention, job-level restore) and
``MetricsBuffer`` writes the metrics history. A rerun with the same
``RunConfig(storage_path, name)`` resumes from the latest committed checkpoint.

Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` set) every process is one rank of the run. The default process group
is the one torchrun's environment describes (joined here unless the script already
did). The ranks exchange their report messages over a separate gloo group, one
``all_gather_object`` per ``train.report()``; every rank runs the same pure
``ReportAggregator`` on the same messages, so all agree on each commit, rank 0 alone
holds the run's lease and writes the run state, and a broadcast tells every rank that
the commit is durable. Each rank writes its own checkpoint files into the run's
``<checkpoint_dir_name>`` (sharded checkpoints), as on Ray. Ray Train's local mode,
by contrast, keeps only the last checkpoint object in memory and writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lumos.runtime import StopRequested, WorkerInfo, WorkerSession
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.metrics_buffer import MetricsBuffer
from lumos.train._internal.controller.reports import Commit, ReportAggregator
from lumos.train._internal.controller.run_book import RunBook
from lumos.train._internal.data_positions import write_positions
from lumos.train._internal.errors import CheckpointReportError, TrainingFailedError
from lumos.train._internal.result import Result, result_from_state
from lumos.train._internal.session import WorkerRunArgs, run_in_session, trial_of
from lumos.train._internal.wire import RankReport, UploadDone, commit_message, decode

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lumos.runtime.context import JobContext
    from lumos.storage import Checkpoint, RetentionPolicy, RunState, RunStorage
    from lumos.train._internal.callback import Callback
    from lumos.train._internal.console import Console
    from lumos.train._internal.controller.spec import ControllerSettings

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""The variables ``torchrun`` sets that local mode needs to join its process group."""


@dataclass(frozen=True)
class LocalSpec:
    """What one local-mode ``fit()`` runs (built by ``DataParallelTrainer.fit``).

    Attributes:
        train_fn: The user's function.
        config: The ``train_loop_config``.
        pass_config: Whether ``train_fn`` takes the config argument.
        storage: The run's storage.
        worker_storage: ``(storage_path, filesystem or None)`` as configured.
        open_state: Loads (and cleans up) or creates the run's state; rank 0 calls it
            while it holds the run's lease.
        process_group_backend: The backend of the default process group joined under
            torchrun (``"gloo"`` or ``"nccl"``).
        use_gpu: Give the rank its local GPU (``torch.cuda.set_device(local_rank)``).
        retention: Which committed checkpoints to keep (``None``: all).
        callbacks: Driver-side callbacks (run on rank 0).
        job_context: The enclosing job (a Tune trial), or ``None``.
        console: Where rank 0's state lines go.
        settings: The metrics-buffer knobs of ``ControllerSettings``.
        resume_from_checkpoint: The trainer's starting checkpoint (fine-tuning).
    """

    train_fn: Callable[..., Any]
    config: dict[str, Any] | None
    pass_config: bool
    storage: RunStorage
    worker_storage: tuple[str, AbstractFileSystem | None]
    open_state: Callable[[RunStorage, Console], RunState]
    process_group_backend: str
    use_gpu: bool
    settings: ControllerSettings
    console: Console
    retention: RetentionPolicy | None = None
    callbacks: tuple[Callback, ...] = ()
    job_context: JobContext | None = None
    resume_from_checkpoint: Checkpoint | None = None


def has_torchrun_env() -> bool:
    """True when this process was started by ``torchrun`` (its rendezvous env is set)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


# -- how the ranks of a local run share their messages ------------------------------------
class _Exchange(Protocol):
    rank: int
    world_size: int

    def gather(self, item: Any) -> list[Any]:
        """Every rank's ``item``, in rank order, on every rank (a collective)."""
        ...

    def broadcast(self, item: Any) -> Any:
        """Rank 0's ``item`` on every rank (a collective)."""
        ...

    def close(self) -> None: ...


class _Alone:
    """The exchange of a single-process run: nothing to exchange."""

    rank = 0
    world_size = 1

    def gather(self, item: Any) -> list[Any]:
        return [item]

    def broadcast(self, item: Any) -> Any:
        return item

    def close(self) -> None:
        pass


class _TorchrunExchange:
    """The ranks torchrun started, exchanging small objects over their own gloo group.

    Joins the default process group from torchrun's environment unless the script
    already did (then it leaves it to the script), and creates a separate gloo group
    for lumos's messages so that they never interleave with the script's collectives.
    """

    def __init__(self, backend: str, use_gpu: bool) -> None:
        import torch
        import torch.distributed as dist

        self._owns_default = not dist.is_initialized()
        local_rank = int(os.environ["LOCAL_RANK"])
        if use_gpu and torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        if self._owns_default:
            dist.init_process_group(backend=backend)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group: Any = dist.new_group(backend="gloo")

    def gather(self, item: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, item, group=self._group)
        return out

    def broadcast(self, item: Any) -> Any:
        import torch.distributed as dist

        box = [item]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def close(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        with contextlib.suppress(Exception):
            dist.destroy_process_group(self._group)
        if self._owns_default:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _worker_info(exchange: _Exchange, use_gpu: bool) -> WorkerInfo:
    rank, world = exchange.rank, exchange.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world))) if world > 1 else 1
    node_rank = int(os.environ.get("GROUP_RANK", str(rank // max(local_world, 1))))
    gpu_ids: list[int] = []
    if use_gpu:
        import torch

        if torch.cuda.is_available():
            gpu_ids = [local_rank]
    return WorkerInfo(
        world_rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank if world > 1 else 0,
        node_id=socket.gethostname(),
        node_ip=os.environ.get("MASTER_ADDR", "127.0.0.1") if rank == 0 else "127.0.0.1",
        pid=os.getpid(),
        gpu_ids=gpu_ids,
    )


# -- the driver side, in the training thread -------------------------------------------
@dataclass
class _Round:
    """What one rank brings to one exchange."""

    report: tuple[Any, ...] | None  # its train.report() message, if this round is one
    uploads: list[tuple[Any, ...]] = field(default_factory=list)  # "u"/"uf" since the last
    ended: bool = False  # its training function returned


class _LocalSession(WorkerSession):
    """The runtime session of a local rank: a blocking ``receive()`` drives the driver.

    A rank waits for a commit notice in ``receive()`` (a SYNC report, or
    ``get_all_reported_checkpoints``). Alone, the notice may wait for a background
    (ASYNC) upload: the driver commits it here, in the training thread, as soon as
    the upload thread says it finished. Under torchrun no rank can commit alone, so
    a wait that no exchange will answer is an error that says so.
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
    """The driver side of a local rank: the session's outbox (``put``) and the commits.

    Args:
        exchange: How the ranks share their messages.
        book: The run's ``RunBook`` (rank 0 only; ``None`` on the other ranks).
        committed_names: The run's committed checkpoint names when the attempt starts.
        spec: The run's spec (callbacks, job context, metrics settings).
    """

    def __init__(
        self,
        exchange: _Exchange,
        book: RunBook | None,
        committed_names: list[str],
        spec: LocalSpec,
    ) -> None:
        self._exchange = exchange
        self._book = book
        self._spec = spec
        self._reports = ReportAggregator(exchange.world_size, committed_names)
        self._cond = threading.Condition(threading.Lock())
        self._uploads: list[tuple[Any, ...]] = []  # this rank's upload outcomes, not exchanged
        self._my_pending: set[int] = set()  # this rank's ASYNC uploads still running
        self.session: _LocalSession | None = None
        self.last_metrics: dict[str, Any] = {}
        self.metrics = (
            MetricsBuffer(
                spec.storage.append_metrics,
                max_rows=spec.settings.metrics_flush_rows,
                interval_s=spec.settings.metrics_flush_interval_s,
            )
            if book is not None
            else None
        )

    # -- Outbox: every message of the session arrives here --------------------------------
    def put(self, item: tuple[str, int, Any]) -> None:
        """Take one message of the session (its ``emit``); runs the driver's side of it."""
        _kind, _seq, payload = item
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
        self._check_parent_stop()
        if message.upload_pending:
            with self._cond:
                self._my_pending.add(message.index)
        self._settle(self._round(_Round(payload)))

    def wait_for_notice(self, take: Callable[[], Any], timeout_s: float | None) -> Any:
        """``take()`` a commit notice; alone, commit finished uploads until one is there."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(TimeoutError):
                return take()
            if self._exchange.world_size > 1:
                raise CheckpointReportError(
                    "under torchrun, a checkpoint uploaded with checkpoint_upload_mode=ASYNC "
                    "is committed at the ranks' next train.report() (or when the function "
                    "returns); call get_all_reported_checkpoints() after that report, or "
                    "use checkpoint_upload_mode=SYNC"
                )
            with self._cond:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no checkpoint commit within {timeout_s} s")
                if not self._uploads:
                    self._cond.wait(remaining)
            self._round(_Round(None))

    def finish(self) -> None:
        """The training function returned: the last round (commits the last uploads)."""
        self._round(_Round(None, ended=True))

    # -- rounds ------------------------------------------------------------------------
    def _settle(self, sync_indices: list[int]) -> None:
        """Exchange until the commits a SYNC report waits for are out.

        ``sync_indices`` come from the round every rank saw, so all ranks agree on how
        many more rounds they take: each waits for its own earlier ASYNC uploads (a
        commit waits for those before it), then brings their outcome to the next round.
        """
        while blocking := [i for i in sync_indices if i in self._reports.in_flight()]:
            with self._cond:
                self._cond.wait_for(partial(self._uploaded_up_to, max(blocking)))
            self._round(_Round(None))

    def _uploaded_up_to(self, index: int) -> bool:
        return not any(i <= index for i in self._my_pending)

    def _round(self, mine: _Round) -> list[int]:
        """One exchange; returns the report indices whose SYNC ranks wait for a commit."""
        with self._cond:
            mine.uploads, self._uploads = self._uploads, []
        rounds: list[_Round] = self._exchange.gather(mine)
        ended = [r for r, x in enumerate(rounds) if x.ended]
        if ended and len(ended) < len(rounds):
            still = [r for r, x in enumerate(rounds) if not x.ended]
            raise CheckpointReportError(
                f"rank(s) {ended} returned while rank(s) {still} still call train.report(); "
                "every rank must call train.report() the same number of times"
            )
        commits: list[Commit] = []
        failed: dict[int, BaseException] = {}
        sync: list[int] = []
        for rank, r in enumerate(rounds):
            if r.report is not None:
                _, report = decode(r.report) or (0, None)
                assert isinstance(report, RankReport)
                if rank == 0:
                    self._on_rank0_metrics(report)
                if report.checkpoint_dir_name is not None and not report.upload_pending:
                    sync.append(report.index)
                commits += self._reports.add(rank, report)
            for upload in r.uploads:
                _, done = decode(upload) or (0, None)
                assert isinstance(done, UploadDone)
                if done.error is not None:
                    failed[rank] = done.error
                else:
                    commits += self._reports.uploaded(rank, done.index)
        if failed:
            raise TrainingFailedError(
                f"Training run {self._spec.storage.name!r} failed: the checkpoint upload of "
                f"rank(s) {sorted(failed)} failed",
                failed,
            )
        if commits:
            self._commit(commits)
        if self.metrics is not None:
            self.metrics.maybe_flush()
        return sync

    def _on_rank0_metrics(self, report: RankReport) -> None:
        self.last_metrics = report.metrics
        if self.metrics is None:
            return
        self.metrics.add(report.index, report.metrics)
        if report.checkpoint_dir_name is None:
            self._deliver(report.metrics, None)

    def _commit(self, commits: list[Commit]) -> None:
        """Rank 0 writes the commits; every rank learns they are durable (a broadcast)."""
        outcome: BaseException | None = None
        delivered: list[tuple[Commit, Checkpoint]] = []
        dropped: list[str] = []
        if self._book is not None:
            assert self.metrics is not None
            self.metrics.flush()
            try:
                for c in commits:
                    if c.data_positions:  # written before the state names the checkpoint
                        write_positions(
                            self._spec.storage,
                            c.dir_name,
                            c.data_positions,
                            self._exchange.world_size,
                        )
                    checkpoint, gone = self._book.commit(c.index, c.dir_name, c.metrics)
                    delivered.append((c, checkpoint))
                    dropped += gone
            except Exception as exc:
                outcome = exc
        if self._exchange.world_size > 1:
            outcome = self._exchange.broadcast(
                None if outcome is None else RuntimeError(f"rank 0 could not commit: {outcome}")
            )
        if outcome is not None:
            raise outcome
        assert self.session is not None
        for c in commits:
            self.session.deliver(commit_message(c.index, c.dir_name))
        if self._book is not None:
            self._book.delete_dropped(dropped)
        for c, checkpoint in delivered:
            if 0 in c.ranks:
                self._deliver(c.metrics, checkpoint)

    def _deliver(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        for cb in self._spec.callbacks:
            cb.on_report(metrics, checkpoint)
        if self._spec.job_context is not None:  # a Tune trial records the checkpoint too
            self._spec.job_context.forward(metrics, checkpoint.uri if checkpoint else None)

    def _check_parent_stop(self) -> None:
        ctx = self._spec.job_context
        if ctx is not None and ctx.stop_event.is_set():
            raise ctx.stop_error()


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
    exchange: _Exchange = (
        _TorchrunExchange(spec.process_group_backend, spec.use_gpu)
        if has_torchrun_env()
        else _Alone()
    )
    try:
        with contextlib.ExitStack() as lease:
            opened: tuple[RunState | None, BaseException | None] = (None, None)
            if exchange.rank == 0:
                try:
                    lease.enter_context(spec.storage.leased())
                    opened = (spec.open_state(spec.storage, spec.console), None)
                except Exception as exc:
                    opened = (None, exc)
            if exchange.world_size > 1:
                shared = exchange.broadcast(
                    opened if opened[1] is None else (None, RuntimeError(str(opened[1])))
                )
                opened = opened if exchange.rank == 0 else shared
            state, error = opened
            if error is not None:
                raise error
            assert state is not None
            if state.status == "finished":
                if exchange.rank == 0:
                    spec.console.info(
                        messages.already_finished_line(spec.storage.name, spec.storage.uri)
                    )
                return result_from_state(spec.storage, state, metrics=None)
            return _run_attempt(spec, exchange, state)
    finally:
        exchange.close()


def _run_attempt(spec: LocalSpec, exchange: _Exchange, state: RunState) -> Result:
    rank0 = exchange.rank == 0
    book = RunBook(spec.storage, state, spec.retention) if rank0 else None
    resume = state.latest()
    attempt = len(state.attempts)
    base = resume.report_index + 1 if resume else 0
    driver = LocalDriver(exchange, book, list(state.checkpoint_names()), spec)
    if book is not None:
        assert driver.metrics is not None
        book.set_status("running")
        book.begin_attempt(attempt)
        driver.metrics.rewind(base)
        spec.console.info(_local_line(exchange))
    path, fs = spec.worker_storage
    args = WorkerRunArgs(
        run_name=spec.storage.name,
        storage_path=path,
        filesystem=fs,
        attempt=attempt,
        report_index_base=base,
        checkpoint_dir_name=resume.dir_name if resume else None,
        pass_config=spec.pass_config,
        committed_names=tuple(state.checkpoint_names()),
        starting_checkpoint=None if resume else spec.resume_from_checkpoint,
        trial=trial_of(spec.job_context),
    )
    session = _LocalSession(_worker_info(exchange, spec.use_gpu), driver)
    driver.session = session
    try:
        for cb in spec.callbacks if rank0 else ():
            cb.on_start(spec.storage.name, spec.storage.uri, spec.config)
        with _env("LUMOS_TRAIN_RUN_NAME", spec.storage.name):
            run_in_session(session, spec.train_fn, spec.config, args)
        driver.finish()
    except BaseException as exc:
        if book is not None:
            _record_failure(spec, book, driver, exc, alone=exchange.world_size == 1)
        raise
    final: RunState | None = None
    result: Result | None = None
    if book is not None:
        assert driver.metrics is not None
        driver.metrics.flush()
        book.end_attempt("finished", None)
        book.set_status("finished")
        result = book.result(dict(driver.last_metrics))
        spec.console.info(
            messages.finished_line(
                spec.storage.name, driver.metrics.next_index, book.latest(), spec.storage.uri
            )
        )
        final = book.state
    if exchange.world_size > 1:
        final = exchange.broadcast(final)
    if result is None:
        assert final is not None
        result = result_from_state(spec.storage, final, metrics=dict(driver.last_metrics))
    for cb in spec.callbacks if rank0 else ():
        cb.on_finish(result, None)
    return result


def _record_failure(
    spec: LocalSpec, book: RunBook, driver: LocalDriver, error: BaseException, alone: bool
) -> None:
    """Rank 0: record how the attempt ended; the run resumes at the next ``fit()``."""
    aborted = isinstance(error, KeyboardInterrupt | StopRequested) or (
        spec.job_context is not None and spec.job_context.stop_event.is_set()
    )
    status: Literal["aborted", "errored"] = "aborted" if aborted else "errored"

    def safe(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # cleanup must not hide the run's own error
            spec.console.warning(messages.cleanup_failed_line(exc))

    if driver.metrics is not None:
        safe(driver.metrics.flush)
    safe(lambda: book.end_attempt(status, f"{type(error).__name__}: {error}"))
    safe(lambda: book.set_status(status))
    if alone:  # nobody writes any more (under torchrun another rank may still upload)
        safe(book.delete_uncommitted)
    if isinstance(error, KeyboardInterrupt):
        spec.console.info(messages.interrupted_line(spec.storage.name))
    for cb in spec.callbacks:
        safe(lambda cb=cb: cb.on_finish(None, error))  # type: ignore[misc]


def _local_line(exchange: _Exchange) -> str:
    if exchange.world_size == 1:
        return "local mode (num_workers=0): running the training function in this process"
    return (
        f"local mode under torchrun: {exchange.world_size} ranks, one per process; "
        "rank 0 commits the checkpoints"
    )


@contextlib.contextmanager
def _env(name: str, value: str) -> Any:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
