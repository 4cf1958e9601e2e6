"""The outcome of a training run."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lumos.storage import Checkpoint, RunState, RunStorage

if TYPE_CHECKING:
    import pandas  # type: ignore[import-untyped, unused-ignore]
    from fsspec import AbstractFileSystem


@dataclass
class Result:
    """What ``fit()`` returns.

    Attributes:
        metrics: the last metrics rank 0 reported (``{}`` when it reported none).
        checkpoint: the latest committed checkpoint, or ``None``.
        best_checkpoints: every checkpoint kept by the retention policy, as
            ``(checkpoint, metrics)`` pairs, oldest first (validation metrics merged
            in; checkpoints a health check rolled back are left out).
        path: the run's directory (local path or fsspec URL).
        error: the error that ended the run, else ``None``.

    ``metrics_dataframe`` reads the run's full report history (every report
    of rank 0, in order) as a pandas DataFrame.

    Example:
        >>> result = trainer.fit()  # doctest: +SKIP
        >>> result.metrics["loss"], result.checkpoint.path  # doctest: +SKIP
        >>> result.metrics_dataframe.plot(y="loss")  # doctest: +SKIP
    """

    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]]
    path: str
    error: BaseException | None = None
    _run_storage: RunStorage | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def filesystem(self) -> AbstractFileSystem:
        """The fsspec filesystem that holds :attr:`path` (Ray's ``Result.filesystem``).

        Ray returns a ``pyarrow.fs.FileSystem``; lumos stores on fsspec, so this is the
        ``fsspec.AbstractFileSystem`` the run wrote with (``RunConfig(storage_filesystem)``,
        else the one the storage URL names; local disk for a local path). ``fs.open``,
        ``fs.ls`` and ``fs.exists`` take :attr:`path` as it is; pyarrow takes an fsspec
        filesystem where it takes its own (``filesystem=result.filesystem``).

        Example:
            >>> result = trainer.fit()  # doctest: +SKIP
            >>> result.filesystem.ls(result.path)  # doctest: +SKIP
        """
        return self._storage().fs

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint whose metrics hold the best ``metric`` (Ray's name).

        Args:
            metric: A metric reported with the checkpoints.
            mode: ``"max"`` or ``"min"``.

        Returns:
            The best of :attr:`best_checkpoints` by ``metric`` (the oldest of equal
            ones, as Ray); ``None`` when no kept checkpoint reported ``metric``.

        Raises:
            TrainConfigError: ``mode`` is neither ``"max"`` nor ``"min"``.
        """
        if mode not in ("max", "min"):
            from lumos.train._internal.errors import TrainConfigError

            raise TrainConfigError(
                f"get_best_checkpoint(mode={mode!r}) is invalid: must be 'max' or 'min'"
            )
        sign = 1.0 if mode == "max" else -1.0
        best: tuple[float, Checkpoint] | None = None
        for checkpoint, metrics in self.best_checkpoints:
            value = metrics.get(metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value == value and (best is None or sign * value > best[0]):  # NaN skipped
                best = (sign * value, checkpoint)
        return best[1] if best is not None else None

    @property
    def metrics_history(self) -> list[dict[str, Any]]:
        """Every report of rank 0, in order, as a list of dicts."""
        return self._storage().read_metrics()

    @property
    def metrics_dataframe(self) -> pandas.DataFrame:
        """Every report of rank 0, in order, as a ``pandas.DataFrame``.

        Raises:
            ImportError: pandas is not installed (``pip install 'lumos-train[pandas]'``).
        """
        try:
            import pandas
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "Result.metrics_dataframe needs pandas; install it with "
                "`pip install 'lumos-train[pandas]'` (or use Result.metrics_history)"
            ) from exc
        return pandas.DataFrame(self.metrics_history)

    def _storage(self) -> RunStorage:
        if self._run_storage is None:  # built by hand: the run is at ``path``
            parent, name = posixpath.split(self.path.rstrip("/"))
            self._run_storage = RunStorage(parent, name)
        return self._run_storage

    @classmethod
    def from_path(cls, path: str, storage_filesystem: AbstractFileSystem | None = None) -> Result:
        """Load the result of a run from its directory.

        Args:
            path: the run directory (``Result.path``), local or an fsspec URL.
            storage_filesystem: the fsspec filesystem, if not inferable.

        Raises:
            FileNotFoundError: no lumos run state is stored there.
        """
        stripped = path.rstrip("/")
        parent, name = posixpath.split(stripped)
        storage = RunStorage(parent, name, storage_filesystem)
        state = storage.load_state()
        if state is None:
            raise FileNotFoundError(f"No lumos run found at {path!r} (no {storage.state_dir})")
        return result_from_state(storage, state, metrics=None)


def result_from_state(
    storage: RunStorage,
    state: RunState,
    metrics: dict[str, Any] | None,
    error: BaseException | None = None,
) -> Result:
    """Build a Result from a stored run state (used by the controller and from_path)."""
    fs = storage.fs
    best = [
        (Checkpoint(storage.checkpoint_path(rec.dir_name), fs), dict(rec.metrics))
        for rec in state.live_checkpoints()
    ]
    latest = state.latest()
    checkpoint = Checkpoint(storage.checkpoint_path(latest.dir_name), fs) if latest else None
    if metrics is None:
        history = storage.read_metrics()
        metrics = dict(history[-1]) if history else (dict(latest.metrics) if latest else {})
    result = Result(
        metrics=metrics,
        checkpoint=checkpoint,
        best_checkpoints=best,
        path=storage.uri,
        error=error,
    )
    result._run_storage = storage
    return result
