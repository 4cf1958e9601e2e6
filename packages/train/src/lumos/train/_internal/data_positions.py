"""Data-loader positions: where each rank's loaders stood at a checkpoint (one owner).

A loader from ``prepare_data_loader`` registers with the rank's training session, in
creation order (its key is that order: ``0``, ``1``, ...); a Ray Data shard from
``train.get_dataset_shard`` registers by name (``"dataset:<name>"``,
``data_resume.py``). Every ``train.report()``
of a rank with loaders carries :meth:`LoaderPositions.snapshot`, the pickled
positions of its live loaders, in the report's wire message. When the report's
checkpoint commits, the driver writes every rank's snapshot into the checkpoint
directory (:func:`write_positions`, before the run state names the checkpoint), so
the positions are committed with the checkpoint in every upload mode (SYNC, ASYNC,
NO_UPLOAD) and travel with it: a restart after a failure, a job-level restore or a
rollback to that checkpoint lands on the same positions.

On resume, a rank's session reads the file of the checkpoint it resumes from
(:meth:`LoaderPositions.restored`) and hands each loader its own position; the
loader applies it at its next ``__iter__``.

File ``<checkpoint>/.lumos_data_positions``: a pickle of
``{"version": 1, "world_size": n, "ranks": {rank: bytes}}`` where each rank's bytes
are the pickle of ``{key: position}``. Positions saved with another world size are
not applied (the shards differ); see :meth:`LoaderPositions.restored`.
"""

from __future__ import annotations

import logging
import pickle
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lumos.storage import RunStorage

logger = logging.getLogger(__name__)

POSITIONS_FILE = ".lumos_data_positions"
_VERSION = 1


class PositionedLoader(Protocol):
    """A loader whose position lumos saves at checkpoints and restores on resume."""

    def position_state(self) -> dict[str, Any]:
        """The loader's position now (picklable)."""
        ...  # pragma: no cover - protocol


class LoaderPositions:
    """The loaders of one rank's training session and the positions it resumes from.

    Args:
        storage: Returns the run's storage (called only when a loader registers on a
            resumed attempt).
        resume_dir: The committed checkpoint this attempt resumes from, or ``None``.
        rank: This rank.
        world_size: The attempt's world size.
    """

    def __init__(
        self,
        storage: Callable[[], RunStorage],
        resume_dir: str | None,
        rank: int,
        world_size: int,
    ) -> None:
        self._storage = storage
        self._resume_dir = resume_dir
        self._rank = rank
        self._world_size = world_size
        self._loaders: dict[int | str, weakref.ref[Any]] = {}
        self._restored: dict[int | str, dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self._loaders)

    def register(self, loader: PositionedLoader, key: str | None = None) -> dict[str, Any] | None:
        """Add ``loader``; return its position to resume from, if any.

        Args:
            loader: The loader.
            key: Its name in the positions (a Ray Data shard: ``"dataset:<name>"``);
                ``None`` (a PyTorch loader): the next number in creation order.
        """
        name: int | str = key if key is not None else sum(isinstance(k, int) for k in self._loaders)
        self._loaders[name] = weakref.ref(loader)
        return self.restored().get(name)

    def snapshot(self) -> bytes | None:
        """The pickled positions of the live loaders; ``None`` when there are none."""
        if not self._loaders:
            return None
        positions = {}
        for key, ref in self._loaders.items():
            loader = ref()
            if loader is not None:
                positions[key] = loader.position_state()
        return pickle.dumps(positions, protocol=pickle.HIGHEST_PROTOCOL)

    def restored(self) -> dict[int | str, dict[str, Any]]:
        """This rank's positions in the resume checkpoint (read once; ``{}`` when none).

        Positions saved with another world size are not applied: the loaders' shards
        differ, so a saved position does not name the same samples. Each loader then
        gets only its epoch counter (``{"epoch": e, "finished": f, "loader": None}``):
        it starts the checkpoint's epoch over with the new shards when the checkpoint
        was taken mid-epoch, or the next epoch when that one was finished.
        """
        if self._restored is None:
            self._restored = self._read()
        return self._restored

    def _read(self) -> dict[int | str, dict[str, Any]]:
        if self._resume_dir is None:
            return {}
        saved = read_positions(self._storage(), self._resume_dir)
        if saved is None:
            return {}
        world_size, ranks = saved
        blob = ranks.get(self._rank)
        if blob is None:
            return {}
        positions: dict[int | str, dict[str, Any]] = pickle.loads(blob)
        if world_size == self._world_size:
            return positions
        logger.warning(
            "lumos.train: checkpoint %r saved data-loader positions with %d workers, this "
            "attempt has %d: the loaders restart the checkpoint's epoch with the new shards",
            self._resume_dir,
            world_size,
            self._world_size,
        )
        return {k: dict(p, loader=None) for k, p in positions.items()}


def positions_path(storage: RunStorage, dir_name: str) -> str:
    """Path of the positions file of checkpoint ``dir_name``."""
    return storage.checkpoint_path(dir_name).rstrip("/") + "/" + POSITIONS_FILE


def write_positions(
    storage: RunStorage, dir_name: str, by_rank: dict[int, bytes], world_size: int
) -> None:
    """Driver side: store every rank's snapshot in checkpoint ``dir_name`` (before its commit)."""
    from lumos.storage import retried_write

    blob = pickle.dumps(
        {"version": _VERSION, "world_size": world_size, "ranks": dict(by_rank)},
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    retried_write(storage.fs, positions_path(storage, dir_name), blob)


def read_positions(storage: RunStorage, dir_name: str) -> tuple[int, dict[int, bytes]] | None:
    """``(world_size, {rank: snapshot})`` of checkpoint ``dir_name``; ``None`` when it has none."""
    from lumos.storage import retried_read

    path = positions_path(storage, dir_name)
    blob = retried_read(storage.fs, path)
    if blob is None:
        return None
    saved = pickle.loads(blob)
    if not isinstance(saved, dict) or saved.get("version") != _VERSION:
        raise RuntimeError(
            f"lumos.train: {path!r} is not a data-positions file of this lumos version "
            f"(version {saved.get('version') if isinstance(saved, dict) else '?'}, "
            f"expected {_VERSION})"
        )
    return int(saved["world_size"]), dict(saved["ranks"])
