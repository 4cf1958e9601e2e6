"""Exact mid-epoch resume of Ray Data shards whose order is fixed (one owner).

``train.get_dataset_shard(name)`` returns a :class:`ResumableShard`: a
``ray.data.DataIterator`` around the shard ``DataConfig.configure`` made. Every loop
over it (``iter_batches``, ``iter_torch_batches``, ``iter_rows``, ...) is one epoch;
the shard counts the batches (and rows) the loop yielded, and registers with the
rank's :class:`~lumos.train._internal.data_positions.LoaderPositions` under
``"dataset:<name>"``, so that count travels with every report and commits with the
checkpoint like a PyTorch loader's position.

On a resumed attempt, the shard's first loop continues the checkpoint's epoch: it
drops the batches consumed before the checkpoint and yields the rest, which is the
exact sequence of a run without the failure when the order is fixed:

* the shard reads a materialized dataset (a plain iterator over a
  ``MaterializedDataset``: ``DataConfig`` splits those with
  ``Dataset.split(n, equal=True)``; fixed blocks per rank, read in order);
* the loop has the checkpoint's arguments (``batch_size``, ``batch_format``,
  ``drop_last``, local shuffle) and a local shuffle has a seed;
* the world size is the checkpoint's (else ``LoaderPositions`` drops the position).

Otherwise (``streaming_split``, a lazy dataset, a changed world size or arguments)
the loop starts the epoch from its first row, as Ray does, and a warning says so
once per shard and attempt.

Position (in ``.lumos_data_positions``): ``{"epoch": e, "finished": f, "loader":
{"batches": k, "rows": n, "args": (...)} | None}``.

Importing this module imports Ray Data: ``datasets.py`` imports it only when the
trainer has ``datasets=``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ray.data.dataset import MaterializedDataset
from ray.data.iterator import DataIterator

if TYPE_CHECKING:
    from lumos.train._internal.data_positions import LoaderPositions

logger = logging.getLogger(__name__)

KEY_PREFIX = "dataset:"
_ARGS = (
    "batch_size",
    "batch_format",
    "drop_last",
    "local_shuffle_buffer_size",
    "local_shuffle_seed",
)


def has_fixed_order(iterator: DataIterator) -> bool:
    """Whether every loop over ``iterator`` yields the same rows in the same order.

    True for a plain iterator over a materialized dataset (``Dataset.split`` shards,
    ``MaterializedDataset.iterator()``); false for ``streaming_split`` iterators and
    lazy datasets, whose blocks go to whichever reader asks first.
    """
    if type(iterator).__name__ != "DataIteratorImpl":
        return False
    return isinstance(getattr(iterator, "_base_dataset", None), MaterializedDataset)


def batch_rows(batch: Any) -> int | None:
    """Rows in ``batch`` (dict of columns, table, frame, array, tensor); ``None`` if unknown."""
    if isinstance(batch, dict):
        first = next(iter(batch.values()), None)
        return None if first is None else batch_rows(first)
    num_rows = getattr(batch, "num_rows", None)
    if isinstance(num_rows, int):
        return num_rows
    try:
        return len(batch)
    except TypeError:
        return None


class ResumableShard(DataIterator):
    """One rank's Ray Data shard that records its position and resumes it.

    A ``ray.data.DataIterator``: every method of Ray's (``iter_batches``,
    ``iter_torch_batches``, ``iter_rows``, ``materialize``, ``stats``, ...) works
    as on the wrapped iterator.

    Args:
        inner: The shard ``DataConfig.configure`` made for this rank.
        name: The dataset's name (its key among the positions).
        positions: The rank's positions, or ``None`` outside a training session.
    """

    def __init__(self, inner: DataIterator, name: str, positions: LoaderPositions | None) -> None:
        self._inner = inner
        self._name = name
        self._exact = has_fixed_order(inner)
        self._epoch = -1  # the current (or last) loop; -1 before the first
        self._in_epoch = False
        self._batches = 0
        self._rows: int | None = 0
        self._args: tuple[Any, ...] = ()
        self._warned = False
        self._pending = None if positions is None else positions.register(self, KEY_PREFIX + name)

    # -- Ray's DataIterator, delegated ---------------------------------------------------
    def _to_ref_bundle_iterator(self) -> Any:
        return self._inner._to_ref_bundle_iterator()

    def _on_iteration_end(self, executor: Any) -> None:
        self._inner._on_iteration_end(executor)

    def _get_dataset_tag(self) -> dict[str, str | None]:
        tag: dict[str, str | None] = self._inner._get_dataset_tag()
        return tag

    def stats(self) -> str:
        """The wrapped shard's ``stats()``."""
        text: str = self._inner.stats()
        return text

    def schema(self) -> Any:
        """The wrapped shard's ``schema()``."""
        return self._inner.schema()

    def get_context(self) -> Any:
        """The wrapped shard's ``DataContext``."""
        return self._inner.get_context()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return repr(self._inner)

    # -- the position --------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) loop over the shard; -1 before the first."""
        return self._epoch

    def position_state(self) -> dict[str, Any]:
        """The position now: the epoch, whether it finished, the batches it yielded."""
        if self._epoch < 0:
            return {"epoch": -1, "finished": True, "loader": None}
        exact = self._exact and self._rows is not None and self._seeded(self._args)
        loader = (
            {"batches": self._batches, "rows": self._rows, "args": self._args}
            if self._in_epoch and exact
            else None
        )
        return {"epoch": self._epoch, "finished": not self._in_epoch, "loader": loader}

    @staticmethod
    def _seeded(args: tuple[Any, ...]) -> bool:
        shuffle, seed = args[3], args[4]
        return shuffle is None or seed is not None

    def _iter_batches(self, **kwargs: Any) -> Iterable[Any]:
        inner: Iterable[Any] = self._inner._iter_batches(**kwargs)
        args = tuple(kwargs.get(k, _DEFAULTS[k]) for k in _ARGS)
        return _Loop(lambda: self._loop(inner, args))

    def _start(self, args: tuple[Any, ...]) -> int:
        """Start a loop (one epoch); return how many batches to drop (a resume)."""
        pending, self._pending = self._pending, None
        self._args, self._batches, self._rows = args, 0, 0
        self._in_epoch = True
        if pending is None or pending["epoch"] < 0:
            self._epoch += 1
            return 0
        self._epoch = pending["epoch"]
        if pending["finished"]:
            self._epoch += 1
            return 0
        saved = pending["loader"]
        if saved is not None and saved["args"] == args and self._exact and self._seeded(args):
            return int(saved["batches"])
        self._warn(saved, args)
        return 0

    def _warn(self, saved: dict[str, Any] | None, args: tuple[Any, ...]) -> None:
        if self._warned:
            return
        self._warned = True
        if saved is not None and saved["args"] != args:
            why = (
                f"this loop's arguments {dict(zip(_ARGS, args, strict=True))} differ from "
                f"the checkpoint's {dict(zip(_ARGS, saved['args'], strict=True))}"
            )
        elif not self._exact:
            why = (
                "its order is not fixed (not a materialized dataset split by DataConfig; "
                "streaming_split gives blocks to whichever worker asks first)"
            )
        elif not self._seeded(args):
            why = "the loop shuffles locally without local_shuffle_seed"
        else:
            why = "the checkpoint has no position inside the epoch (another world size)"
        logger.warning(
            "lumos.train: dataset %r restarts epoch %d from its first row: %s",
            self._name,
            self._epoch,
            why,
        )

    def _loop(self, inner: Iterable[Any], args: tuple[Any, ...]) -> Iterator[Any]:
        skip = self._start(args)  # batches consumed before the checkpoint: counted, not yielded
        try:
            for batch in inner:
                rows = batch_rows(batch)
                self._batches += 1
                self._rows = None if rows is None or self._rows is None else self._rows + rows
                if self._batches > skip:
                    yield batch
        finally:
            self._in_epoch = False


_DEFAULTS: dict[str, Any] = {
    "batch_size": 256,
    "batch_format": "default",
    "drop_last": False,
    "local_shuffle_buffer_size": None,
    "local_shuffle_seed": None,
}


class _Loop:
    """An iterable whose every ``iter()`` is a new loop (Ray's ``_IterableFromIterator``)."""

    def __init__(self, start: Callable[[], Iterator[Any]]) -> None:
        self._start = start

    def __iter__(self) -> Iterator[Any]:
        return self._start()
