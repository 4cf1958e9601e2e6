"""``train.DataConfig``: how the trainer's Ray Datasets are given to the workers.

Ray's names and semantics (``ray.train.DataConfig``): datasets named in
``datasets_to_split`` are divided across the workers in equal shares; the others
are given whole to every worker. Importing this module does not import Ray Data.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

if TYPE_CHECKING:
    from ray.data import DataIterator, Dataset, ExecutionOptions


class DataConfig(BaseModel):
    """Which datasets are split across the workers, and Ray Data's execution options.

    Args:
        datasets_to_split: ``"all"`` (default) or a list of dataset names: those are
            divided across the workers in equal shares (rows beyond an equal share
            are dropped, as in Ray); the others reach every worker whole.
        execution_options: Ray Data ``ExecutionOptions`` for every dataset, or a dict
            of them by dataset name; datasets not in the dict (and all, when
            ``None``) get :meth:`default_ingest_options`.
        enable_shard_locality: split streaming datasets with the workers' nodes as
            locality hints (less cross-node traffic).

    Subclass it and override :meth:`configure` to assign datasets your own way.

    Example:
        >>> DataConfig(datasets_to_split=["train"]).datasets_to_split
        ['train']
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    datasets_to_split: Literal["all"] | list[str] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    @field_validator("datasets_to_split", mode="before")
    @classmethod
    def _check_split(cls, value: Any) -> Any:
        ok = value == "all" or (
            isinstance(value, list) and all(isinstance(v, str) and v for v in value)
        )
        if not ok:
            raise ValueError(
                f"datasets_to_split={value!r} must be 'all' or a list of dataset names "
                "(keys of the trainer's datasets=)"
            )
        return value

    def split_names(self, names: list[str]) -> set[str]:
        """The names among ``names`` whose datasets are split."""
        if self.datasets_to_split == "all":
            return set(names)
        return set(self.datasets_to_split)

    def execution_options_for(self, name: str) -> ExecutionOptions:
        """A copy of the execution options of dataset ``name``."""
        opts = self.execution_options
        if isinstance(opts, dict):
            opts = opts.get(name)
        return copy.deepcopy(opts if opts is not None else self.default_ingest_options())

    def configure(
        self,
        datasets: dict[str, Dataset],
        world_size: int,
        worker_handles: list[Any] | None,
        worker_node_ids: list[str] | None,
        **kwargs: Any,
    ) -> list[dict[str, DataIterator]]:
        """Assign the datasets to ``world_size`` workers (called at every group start).

        A split dataset that is already materialized (``ray.data.from_numpy``,
        ``from_pandas``, ``from_items``, ``ds.materialize()``) is divided by
        ``Dataset.split(world_size, equal=True)``: each worker reads its own blocks
        straight from the object store, in a fixed order. Any other split dataset is
        divided by ``Dataset.streaming_split(world_size, equal=True)``, as in Ray: it
        is executed once per epoch for all workers, and blocks go to whichever
        worker asks first.

        Args:
            datasets: The trainer's datasets by name.
            world_size: The number of workers of this (re)start.
            worker_handles: Not used (Ray's signature).
            worker_node_ids: The workers' Ray node ids by rank (locality hints).
            **kwargs: Forward compatibility.

        Returns:
            One ``{name: DataIterator}`` per rank.
        """
        from ray.data.dataset import MaterializedDataset

        output: list[dict[str, DataIterator]] = [{} for _ in range(world_size)]
        to_split = self.split_names(list(datasets))
        hints = worker_node_ids if self.enable_shard_locality else None
        for name, dataset in datasets.items():
            if dataset.name is None:
                dataset.set_name(name)
            options = self.execution_options_for(name)
            if name in to_split and isinstance(dataset, MaterializedDataset):
                shards = dataset.split(world_size, equal=True)
                for rank, shard in enumerate(shards):
                    shard.context.execution_options = copy.deepcopy(options)
                    output[rank][name] = shard.iterator()
                continue
            ds = dataset.copy(dataset)
            ds.context.execution_options = options
            if name in to_split:
                for rank, split in enumerate(
                    ds.streaming_split(world_size, equal=True, locality_hints=hints)
                ):
                    output[rank][name] = split
            else:
                for rank in range(world_size):
                    output[rank][name] = ds.iterator()
        return output

    @staticmethod
    def default_ingest_options() -> ExecutionOptions:
        """Ray Data's options for ingest: a copy of the current ``DataContext``'s."""
        from ray.data.context import DataContext

        options: ExecutionOptions = copy.deepcopy(DataContext.get_current().execution_options)
        return options
