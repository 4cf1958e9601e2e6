"""Data input without a cluster: loader positions, their file, DataConfig, the [data] extra."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
from pathlib import Path
from typing import Any

import data_fns
import pytest
import torch
from conftest import run_config
from torch.utils.data import DataLoader, TensorDataset

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunStorage
from lumos.train._internal.data_positions import (
    LoaderPositions,
    read_positions,
    write_positions,
)
from lumos.train._internal.datasets import dataset_shard
from lumos.train.torch import prepare_data_loader


def _loader(shuffle: bool, workers: int = 0, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    data = TensorDataset(torch.arange(23))
    # Loader workers come from a forkserver: this test process runs threads (a Ray
    # session, tqdm), and a worker forked from it can deadlock on a lock one held. The
    # server imports torch once, so a worker does not import it again (2 minutes less).
    context = "forkserver" if workers else None
    if workers:
        multiprocessing.set_forkserver_preload(["torch"])
    return prepare_data_loader(
        DataLoader(
            data,
            batch_size=4,
            shuffle=shuffle,
            num_workers=workers,
            multiprocessing_context=context,
        )
    )


def _epochs(loader: Any, epochs: int) -> list[tuple[int, list[int]]]:
    return [(loader.epoch, b.tolist()) for _ in range(epochs) for (b,) in loader]


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-loader-workers"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "sequential"])
@pytest.mark.parametrize("at_epoch_end", [False, True], ids=["mid-epoch", "after-epoch"])
def test_a_restored_loader_continues_the_exact_batch_sequence(
    shuffle: bool, workers: int, at_epoch_end: bool
) -> None:
    full = _epochs(_loader(shuffle, workers), 3)  # 6 batches per epoch
    stops = [6, 12] if at_epoch_end else [1, 5, 6, 9, 13]
    for stop in stops:
        loader = _loader(shuffle, workers)
        head: list[tuple[int, list[int]]] = []
        position = None
        while position is None:
            for (b,) in loader:
                head.append((loader.epoch, b.tolist()))
                if len(head) == stop and not at_epoch_end:
                    position = loader.position_state()
                    break
            if len(head) == stop and at_epoch_end:
                position = loader.position_state()
        # a new process: another global seed, the position comes through pickle
        resumed = _loader(shuffle, workers, seed=123)
        resumed.load_position(pickle.loads(pickle.dumps(position)))
        tail: list[tuple[int, list[int]]] = []
        while len(head) + len(tail) < len(full):
            tail += [(resumed.epoch, b.tolist()) for (b,) in resumed]
        assert head + tail == full, f"resumed after {stop} batches"


def test_positions_file_round_trip_and_a_world_size_change(tmp_path: Path) -> None:
    storage = RunStorage(tmp_path, "run")
    (tmp_path / "run" / "ckpt").mkdir(parents=True)
    mid = {"epoch": 2, "finished": False, "loader": {"x": 1}}
    write_positions(storage, "ckpt", {0: pickle.dumps({0: mid}), 1: pickle.dumps({})}, 2)
    assert read_positions(storage, "ckpt") == (
        2,
        {0: pickle.dumps({0: mid}), 1: pickle.dumps({})},
    )
    same = LoaderPositions(lambda: storage, "ckpt", rank=0, world_size=2)
    assert same.restored() == {0: mid}
    # another world size: the shards differ, only the epoch counter is kept
    other = LoaderPositions(lambda: storage, "ckpt", rank=0, world_size=3)
    assert other.restored() == {0: {"epoch": 2, "finished": False, "loader": None}}
    assert LoaderPositions(lambda: storage, "none", rank=0, world_size=2).restored() == {}
    assert LoaderPositions(lambda: storage, None, rank=0, world_size=2).restored() == {}


def test_a_world_size_change_restarts_the_checkpoints_epoch() -> None:
    # without a saved loader state (another world size), epoch 0 starts over
    full = _epochs(_loader(False), 2)
    resumed = _loader(False)
    resumed.load_position({"epoch": 0, "finished": False, "loader": None})
    assert _epochs(resumed, 2) == full
    finished = _loader(True, seed=5)
    finished.load_position({"epoch": 0, "finished": True, "loader": None})
    assert [e for e, _ in _epochs(finished, 1)] == [1] * 6


def test_position_save_is_small_and_a_prepared_loader_keeps_the_dataloader_interface() -> None:
    loader = _loader(True)
    assert loader.position_state() == {"epoch": -1, "finished": True, "loader": None}
    it = iter(loader)
    next(it)
    assert len(pickle.dumps(loader.position_state())) < 8192
    assert len(loader) == 6
    assert loader.batch_size == 4
    with pytest.raises(TypeError, match=r"torch\.utils\.data\.DataLoader"):
        prepare_data_loader([1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_failed_rank_resumes_its_loader_where_the_checkpoint_left_it(
    tmp_path: Path, mode: str
) -> None:
    # 2 ranks x 10 samples, batches of 3: 4 batches per rank and epoch; checkpoints every
    # 3 steps (mid-epoch); rank 1 fails at step 8, after checkpoint step=6.
    def run(name: str, die: dict[str, Any] | None) -> list[list[list[int]]]:
        out = tmp_path / name
        out.mkdir()
        config = {"n": 20, "batch": 3, "epochs": 3, "every": 3, "out": str(out), "mode": mode}
        if die:
            config["die"] = die
        train.DataParallelTrainer(
            data_fns.loader_loop,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(
                tmp_path, name, failure_config=train.FailureConfig(max_failures=1)
            ),
            _group_factory=FakeCluster().start,
        ).fit()
        return [data_fns.batches_by_step(out / f"rank{r}.jsonl") for r in range(2)]

    reference = run("reference", None)
    assert len(reference[0]) == 12
    resumed = run("failed", {"rank": 1, "step": 8, "how": "raise"})
    assert resumed == reference


def test_dataset_shard_lookup_errors_name_the_datasets() -> None:
    assert dataset_shard({"train": 1}, None) == 1
    assert dataset_shard({"train": 1, "val": 2}, "val") == 2
    with pytest.raises(KeyError, match=r"\['train', 'val'\]"):
        dataset_shard({"train": 1, "val": 2}, "test")
    with pytest.raises(KeyError, match="has no datasets"):
        dataset_shard({}, "train")


def test_data_config_refuses_bad_values_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="datasets_to_split="):
        train.DataConfig(datasets_to_split="some")  # type: ignore[arg-type]
    assert train.DataConfig(datasets_to_split=["train"]).split_names(["train", "val"]) == {"train"}
    assert train.DataConfig().split_names(["train", "val"]) == {"train", "val"}


def test_datasets_without_the_data_extra_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray.data", None)  # import ray.data raises ImportError
    with pytest.raises(train.TrainConfigError, match=r'pip install "lumos-train\[data\]"'):
        train.DataParallelTrainer(data_fns.shard_rows, datasets={"train": object()})


def test_datasets_must_be_a_dict_of_ray_datasets() -> None:
    with pytest.raises(train.TrainConfigError, match=r"datasets=.*is a list"):
        train.DataParallelTrainer(data_fns.shard_rows, datasets=[1])  # type: ignore[arg-type]
    with pytest.raises(train.TrainConfigError, match=r"datasets\['train'\]=3 is a int"):
        train.DataParallelTrainer(data_fns.shard_rows, datasets={"train": 3})
