"""Worker side: the training session behind ``train.report`` and friends.

The controller launches :func:`run_train_worker` on every worker of a
``lumos.runtime.WorkerGroup``; it runs the user's function in the runtime's
user thread. Reports travel as small tuples through the runtime session:

* ``("r", attempt, index, metrics, dir_name)``: a report; ``dir_name`` is the
  checkpoint directory this rank persisted files into, or ``None``.

For a report with a checkpoint the rank then blocks in ``session.receive()``
until the controller answers ``("ack", index)`` (committed: every rank reported
it). When the ranks disagree about the checkpoint, no answer comes: the
controller ends the run and stops the workers. This module owns the format:
the driver reads reports with :func:`decode_report` and answers with
:func:`ack_message`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lumos.runtime import CurrentSlot
from lumos.train._internal.errors import CheckpointReportError, NotInTrainingFunctionError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lumos.runtime import WorkerInfo
    from lumos.runtime.worker import WorkerSession
    from lumos.storage import Checkpoint, RunStorage

# Worker-side imports stay light: lumos.storage (pydantic, fsspec) is imported when a
# checkpoint or the storage is first needed, not before the first metrics report.

REPORT = "r"
ACK = "ack"


@dataclass(frozen=True)
class RankReport:
    """One rank's ``train.report()`` call as the driver receives it.

    Attributes:
        index: The report's index in the run (the same on every rank).
        metrics: The rank's metrics.
        checkpoint_dir_name: The checkpoint directory the rank persisted files
            into, or ``None`` (metrics only).
    """

    index: int
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None


def decode_report(payload: Any) -> tuple[int, RankReport] | None:
    """``(attempt, report)`` from a worker's report message; ``None`` for other payloads."""
    if not (isinstance(payload, tuple) and payload and payload[0] == REPORT):
        return None
    _, attempt, index, metrics, dir_name = payload
    return int(attempt), RankReport(index, metrics, dir_name)


def ack_message(index: int) -> tuple[str, int]:
    """The driver's answer to a report with a checkpoint: committed."""
    return (ACK, index)


def default_checkpoint_dir_name(index: int) -> str:
    """Name of a checkpoint directory when the user gave none."""
    return f"checkpoint_{index}"


@dataclass(frozen=True)
class WorkerRunArgs:
    """What every rank needs to know about the run (pickled once per launch).

    ``storage_path`` / ``filesystem`` are what the user configured (a path or URL and
    an optional fsspec filesystem), so that no filesystem object is shipped when none
    was given.
    """

    run_name: str
    storage_path: str
    filesystem: AbstractFileSystem | None
    attempt: int
    report_index_base: int
    checkpoint_dir_name: str | None
    pass_config: bool


class WorkerHooks:
    """Per-worker setup/teardown around the user's function (a backend's worker half)."""

    def on_start(self, context: TrainContext) -> None:
        """Called in the user thread before the training function."""

    def on_end(self, context: TrainContext, error: BaseException | None) -> None:
        """Called in the user thread after the training function."""


class TrainContext:
    """Facts about the current worker and run, from ``train.get_context()``.

    Example:
        >>> ctx = train.get_context()  # doctest: +SKIP
        >>> if ctx.get_world_rank() == 0:  # doctest: +SKIP
        ...     print("world size", ctx.get_world_size())
    """

    def __init__(self, info: WorkerInfo, args: WorkerRunArgs) -> None:
        self._info = info
        self._args = args
        self._storage: RunStorage | None = None

    def get_world_size(self) -> int:
        """Number of workers in the run."""
        return int(self._info.world_size)

    def get_world_rank(self) -> int:
        """This worker's rank among all workers (0 .. world size - 1)."""
        return int(self._info.world_rank)

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return int(self._info.local_rank)

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return int(self._info.local_world_size)

    def get_node_rank(self) -> int:
        """Index of this worker's node among the run's nodes."""
        return int(self._info.node_rank)

    def get_run_name(self) -> str:
        """The run's name (``RunConfig.name``)."""
        return self._args.run_name

    def get_storage(self) -> RunStorage:
        """The run's storage (``lumos.storage.RunStorage``): ``.run_path``, ``.fs``, ..."""
        if self._storage is None:
            from lumos.storage import RunStorage

            self._storage = RunStorage(
                self._args.storage_path, self._args.run_name, self._args.filesystem
            )
        return self._storage

    def get_attempt(self) -> int:
        """0 for the first attempt, incremented at every restart after a failure."""
        return self._args.attempt

    def get_worker_info(self) -> WorkerInfo:
        """The runtime's ``WorkerInfo`` of this worker (node id/ip, pid, gpu ids)."""
        return self._info


class _TrainSession:
    def __init__(
        self,
        runtime_session: WorkerSession,
        context: TrainContext,
        args: WorkerRunArgs,
    ) -> None:
        self.runtime = runtime_session
        self.context = context
        self.args = args
        self.next_index = args.report_index_base
        self._checkpoint_dir_name = args.checkpoint_dir_name

    @property
    def checkpoint(self) -> Checkpoint | None:
        if self._checkpoint_dir_name is None:
            return None
        return self.context.get_storage().checkpoint(self._checkpoint_dir_name)

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None,
        checkpoint_dir_name: str | None,
    ) -> None:
        # a stop requested by the driver (restart, parent job, Ctrl-C) ends the function here
        self.runtime.raise_if_stop_requested()
        index = self.next_index
        self.next_index += 1
        if checkpoint is None:
            if checkpoint_dir_name is not None:
                raise CheckpointReportError(
                    f"train.report(checkpoint_dir_name={checkpoint_dir_name!r}) was given "
                    "without a checkpoint; pass checkpoint=train.Checkpoint.from_directory(...)"
                )
            self.runtime.emit((REPORT, self.args.attempt, index, dict(metrics), None))
            return
        from lumos.storage import validate_name

        dir_name = (
            default_checkpoint_dir_name(index)
            if checkpoint_dir_name is None
            else validate_name(checkpoint_dir_name, "checkpoint_dir_name")
        )
        storage = self.context.get_storage()
        with checkpoint.as_directory() as local_dir:
            storage.persist_directory(local_dir, dir_name)
        self.runtime.emit((REPORT, self.args.attempt, index, dict(metrics), dir_name))
        answer = self.runtime.receive(None)
        if answer != ack_message(index):  # pragma: no cover - protocol bug
            raise RuntimeError(f"lumos.train: unexpected answer {answer!r} to report {index}")
        self._checkpoint_dir_name = dir_name


_current: CurrentSlot[_TrainSession] = CurrentSlot()


def current_session(api: str) -> _TrainSession:
    """The session of the calling training thread; helpful error outside of one.

    Raises:
        NotInTrainingFunctionError: no training function runs in this process (or
            several do and the calling thread belongs to none of them).
    """
    session = _current.get()
    if session is None:
        raise NotInTrainingFunctionError(
            f"lumos.train.{api}() can only be called inside a training function run by a "
            "lumos trainer (e.g. TorchTrainer(train_fn, ...).fit())"
        )
    return session


def run_train_worker(
    train_fn: Callable[..., Any],
    config: dict[str, Any] | None,
    args: WorkerRunArgs,
    hooks: WorkerHooks | None = None,
) -> dict[str, Any]:
    """Entry point launched on every worker: set up the session, run the user's function."""
    from lumos.runtime import worker

    runtime_session = worker.get_session()
    if runtime_session is None or runtime_session.info is None:  # pragma: no cover
        raise RuntimeError("lumos.train worker started outside of a lumos.runtime WorkerGroup")
    context = TrainContext(runtime_session.info, args)
    session = _TrainSession(runtime_session, context, args)
    os.environ["LUMOS_TRAIN_RUN_NAME"] = args.run_name
    _current.activate(session)
    error: BaseException | None = None
    try:
        if hooks is not None:
            hooks.on_start(context)
        if args.pass_config:
            train_fn(config if config is not None else {})
        else:
            train_fn()
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            if hooks is not None:
                hooks.on_end(context, error)
        finally:
            _current.deactivate(session)
    return {"attempt": args.attempt, "reports": session.next_index - args.report_index_base}
