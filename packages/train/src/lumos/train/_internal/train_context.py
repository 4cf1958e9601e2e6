"""What a rank knows about its run: ``WorkerRunArgs`` and ``train.get_context()``.

The controller (or local mode) builds one :class:`WorkerRunArgs` per launch; every
rank wraps it with its runtime ``WorkerInfo`` in a :class:`TrainContext`. Both the
worker entry point (``session.py``) and the training session (``reporting.py``) read
them; this module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lumos.runtime import WorkerInfo
    from lumos.runtime.context import JobContext
    from lumos.storage import Checkpoint, RunStorage
    from lumos.train._internal.health import RollbackInfo

# Worker-side imports stay light: lumos.storage (pydantic, fsspec) is imported when a
# checkpoint or the storage is first needed, not before the first metrics report.


@dataclass(frozen=True)
class WorkerRunArgs:
    """What every rank needs to know about the run (pickled once per launch).

    ``checkpoint_dir_name`` is the run's latest committed checkpoint (where the attempt
    resumes), ``committed_names`` every committed checkpoint's name (names are unique in
    a run) and ``starting_checkpoint`` the trainer's ``resume_from_checkpoint``, which
    ``get_checkpoint()`` returns while the run has no committed checkpoint of its own.

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
    committed_names: tuple[str, ...] = ()
    starting_checkpoint: Checkpoint | None = None
    has_validation: bool = False
    rollback: RollbackInfo | None = None
    trial: tuple[str, str, str] | None = None
    """``(id, name, dir)`` of the Tune trial this run runs in (``JobContext``), if any."""
    training_done: bool = False
    """Training finished under an earlier driver: local mode does not run it again."""


def trial_of(ctx: JobContext | None) -> tuple[str, str, str] | None:
    """``WorkerRunArgs.trial`` from the enclosing job's context (a Tune trial), if any."""
    if ctx is None or ctx.kind != "tune.trial":
        return None
    return (ctx.id, ctx.name, ctx.storage_path)


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

    def get_trial_id(self) -> str | None:
        """The id of the Tune trial this run runs in (``"00007"``), else ``None`` (Ray's name)."""
        return self._args.trial[0] if self._args.trial else None

    def get_trial_name(self) -> str | None:
        """The name of the Tune trial this run runs in, else ``None`` (Ray's name)."""
        return self._args.trial[1] if self._args.trial else None

    def get_trial_dir(self) -> str | None:
        """The directory (URL) of the Tune trial this run runs in, else ``None`` (Ray's name)."""
        return self._args.trial[2] if self._args.trial else None

    def get_rollback_info(self) -> RollbackInfo | None:
        """How a health check rolled this run back, while training resumes from there.

        ``None`` unless the run's last rollback went back to the checkpoint this
        attempt resumed from (so also after a later failure restarted from it).
        Use it to skip the data that made a metric spike.

        Example:
            >>> info = train.get_context().get_rollback_info()  # doctest: +SKIP
            >>> if info is not None:
            ...     print(info.check, info.reason, info.from_report, info.to_checkpoint)
        """
        return self._args.rollback

    def get_attempt(self) -> int:
        """0 for the first attempt, incremented at every restart after a failure."""
        return self._args.attempt

    def get_worker_info(self) -> WorkerInfo:
        """The runtime's ``WorkerInfo`` of this worker (node id/ip, pid, gpu ids)."""
        return self._info
