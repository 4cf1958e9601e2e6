"""Ray Data input: the trainer's ``datasets=`` checked, split at every group start, and
handed to each rank's ``train.get_dataset_shard(name)``.

:class:`DatasetBackend` wraps the trainer's backend. Before every launch of the
training function (the first start, a restart after a failure, a job-level restore
and, later, a resize) it asks ``DataConfig.configure`` for the shards of the group's
current world size, so a split always matches the group it feeds. The shards travel
to the ranks with the launch (:class:`DataHooks`) and are dropped, with the Ray Data
coordinators they hold, at the next launch and when ``fit()`` ends.

Ray Data is an optional extra (``lumos-train[data]``): it is imported only when
``datasets=`` is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.train._internal.backend import Backend
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.reporting import CURRENT
from lumos.train._internal.session import WorkerHooks

if TYPE_CHECKING:
    from lumos.runtime import WorkerGroupProtocol
    from lumos.train._internal.data_config import DataConfig
    from lumos.train._internal.train_context import TrainContext

EXTRA = 'pip install "lumos-train[data]"'


def import_ray_data(what: str) -> Any:
    """``ray.data``, or a ``TrainConfigError`` naming the ``[data]`` extra."""
    try:
        import ray.data
    except ImportError as exc:
        raise TrainConfigError(
            f"{what} needs Ray Data, which is not installed ({type(exc).__name__}: {exc}); "
            f'install the extra: {EXTRA} (pulls "ray[data]": pyarrow, pandas)'
        ) from exc
    return ray.data


def check_datasets(datasets: Any) -> dict[str, Any]:
    """The trainer's ``datasets=`` checked: ``{name: Dataset or fn() -> Dataset}``.

    Raises:
        TrainConfigError: not a dict of names to Ray Datasets (or callables returning
            one), or Ray Data is not installed.
    """
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise TrainConfigError(
            f"datasets={datasets!r} is a {type(datasets).__name__}; pass a dict of "
            'names to Ray Datasets, e.g. {"train": ray.data.from_numpy(x)}'
        )
    if not datasets:
        return {}
    ray_data = import_ray_data("TorchTrainer(datasets=...)")
    for name, ds in datasets.items():
        if not isinstance(name, str) or not name:
            raise TrainConfigError(f"datasets: key {name!r} must be a non-empty string")
        if not (isinstance(ds, ray_data.Dataset) or callable(ds)):
            raise TrainConfigError(
                f"datasets[{name!r}]={ds!r} is a {type(ds).__name__}; pass a "
                "ray.data.Dataset (or a function returning one)"
            )
    return dict(datasets)


def check_data_config(config: Any, names: list[str]) -> DataConfig:
    """The trainer's ``dataset_config=`` (default ``DataConfig()``), checked against ``names``."""
    from lumos.train._internal.data_config import DataConfig

    if config is None:
        return DataConfig()
    if not isinstance(config, DataConfig):
        raise TrainConfigError(f"dataset_config={config!r} is not a train.DataConfig")
    if config.datasets_to_split != "all":
        unknown = sorted(set(config.datasets_to_split) - set(names))
        if unknown:
            raise TrainConfigError(
                f"DataConfig(datasets_to_split={config.datasets_to_split!r}) names "
                f"{unknown}, which datasets= does not have (it has {sorted(names)})"
            )
    return config


class DataHooks(WorkerHooks):
    """Worker half: puts this rank's shards into its session, around the inner hooks."""

    def __init__(self, inner: WorkerHooks | None, shards: list[dict[str, Any]]) -> None:
        self.inner = inner
        self.shards = shards

    def on_start(self, context: TrainContext) -> None:
        if self.inner is not None:
            self.inner.on_start(context)
        session = CURRENT.get()
        if session is not None:  # each shard records its position (data_resume.py)
            from lumos.train._internal.data_resume import ResumableShard

            session.dataset_shards = {
                name: ResumableShard(shard, name, session.positions)
                for name, shard in self.shards[context.get_world_rank()].items()
            }

    def on_end(self, context: TrainContext, error: BaseException | None) -> None:
        if self.inner is not None:
            self.inner.on_end(context, error)

    def for_replacement(self) -> DataHooks:
        inner = self.inner.for_replacement() if self.inner is not None else None
        return DataHooks(inner, self.shards)


class DatasetBackend(Backend):
    """Driver half: the trainer's backend plus the datasets, split at every launch.

    Args:
        inner: The trainer's own backend (e.g. the torch process group).
        datasets: ``{name: Dataset or fn() -> Dataset}``.
        config: How to split them.
    """

    def __init__(self, inner: Backend, datasets: dict[str, Any], config: DataConfig) -> None:
        self.inner = inner
        self.warm_imports = (*inner.warm_imports, "ray.data")
        self.peer_recovery = inner.peer_recovery
        self._datasets = datasets
        self._resolved: dict[str, Any] | None = None
        self._config = config
        self._shards: list[dict[str, Any]] | None = None

    def _resolve(self) -> dict[str, Any]:
        if self._resolved is None:
            fns: dict[str, Callable[[], Any]] = {
                k: v for k, v in self._datasets.items() if callable(v)
            }
            self._resolved = {k: (fns[k]() if k in fns else v) for k, v in self._datasets.items()}
        return self._resolved

    def prepare_launch(self, group: WorkerGroupProtocol) -> WorkerHooks:
        hooks = self.inner.prepare_launch(group)
        self._shards = None  # the previous launch's coordinators go with it
        workers = group.workers
        self._shards = self._config.configure(
            self._resolve(),
            world_size=len(workers),
            worker_handles=None,
            worker_node_ids=[w.node_id for w in workers],
        )
        return DataHooks(hooks, self._shards)

    def shutdown(self) -> None:
        self._shards = None
        self._resolved = None
        self.inner.shutdown()


def dataset_shard(shards: dict[str, Any], name: str | None) -> Any:
    """Rank-side lookup for ``train.get_dataset_shard(name)``."""
    if name is None and len(shards) == 1:
        return next(iter(shards.values()))
    if name in shards:
        return shards[name]
    if not shards:
        raise KeyError(
            f"train.get_dataset_shard({name!r}): the trainer has no datasets; pass them "
            'as TorchTrainer(..., datasets={"train": ds})'
        )
    raise KeyError(
        f"train.get_dataset_shard({name!r}): no such dataset; the trainer's datasets are "
        f"{sorted(shards)}"
    )
