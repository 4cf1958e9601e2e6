"""prepare_data_loader / prepare_model / get_device without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import train_fns
from conftest import run_config
from torch.utils.data import DataLoader, TensorDataset

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.train.torch import get_device, prepare_data_loader, prepare_model


@pytest.mark.parametrize("shuffle", [True, False])
def test_data_loader_is_sharded_and_reshuffled_every_epoch(tmp_path: Path, shuffle: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    trainer = train.DataParallelTrainer(
        train_fns.data_loader_epochs,
        train_loop_config={"n": 20, "shuffle": shuffle, "out": str(out)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path),
        _group_factory=FakeCluster().start,
    )
    trainer.fit()
    r0 = json.loads((out / "rank0.json").read_text())
    r1 = json.loads((out / "rank1.json").read_text())
    assert r0["len"] == r1["len"] == 5  # 10 samples per rank, batches of 2
    for epoch in range(2):
        a, b = r0["seen"][epoch], r1["seen"][epoch]
        assert len(a) == len(b) == 10
        assert sorted(a + b) == list(range(20))  # disjoint shards covering everything
    if shuffle:
        assert r0["seen"][0] != r0["seen"][1]  # the epoch advanced by itself
    else:
        assert r0["seen"][0] == r0["seen"][1]


def test_outside_a_run_everything_is_single_process() -> None:
    assert get_device() == torch.device("cpu") or torch.cuda.is_available()
    model = torch.nn.Linear(2, 1)
    assert prepare_model(model) is model  # one worker: no DDP wrapper
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(6)), batch_size=4))
    assert len(loader) == 2
    assert loader.batch_size == 4
    assert [len(b[0]) for b in loader] == [4, 2]
    with pytest.raises(ValueError, match="parallel_strategy"):
        prepare_model(model, parallel_strategy="deepspeed")
