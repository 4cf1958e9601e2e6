"""A tiny Lightning regression and its lumos training function (shipped by value to workers).

Data in code: ``x`` (64 x 8) from a fixed seed, ``y = x @ w``; the training set is
split by Lightning's ``DistributedSampler`` across the ranks (2 ranks, batch 8: 4
steps per epoch each), validation on 16 more rows.
"""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lumos import train
from lumos.train.lightning import (
    CHECKPOINT_NAME,
    LumosDDPStrategy,
    RayLightningEnvironment,
    ReportCallback,
    get_checkpoint_path,
    prepare_trainer,
)

ROWS, VAL_ROWS, FEATURES, BATCH = 64, 16, 8, 8


def datasets() -> tuple[TensorDataset, TensorDataset]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS + VAL_ROWS, FEATURES, generator=gen)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1)
    return TensorDataset(x[:ROWS], y[:ROWS]), TensorDataset(x[ROWS:], y[ROWS:])


class Regression(pl.LightningModule):
    """Linear regression; logs ``train_loss``, ``val_loss``, ``start_epoch`` and
    ``score`` (``offset + val_loss``: what a Tune pruner watches)."""

    def __init__(self, lr: float = 0.1, offset: float = 0.0, die: dict[str, int] | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.lr, self.offset, self.die = lr, offset, die
        self.start_epoch = -1

    def on_train_start(self) -> None:
        self.start_epoch = self.trainer.current_epoch  # > 0 when resumed from a checkpoint

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.log("start_epoch", float(self.start_epoch))
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Dies after the first step of epoch ``die["epoch"]`` of attempt 0: that step's
        # gradient all-reduce needed rank 0 there, so the previous epoch's checkpoint
        # (rank 0's SYNC report returned) is committed.
        die, ctx = self.die, train.get_context()
        if (
            die
            and ctx.get_attempt() == 0
            and ctx.get_world_rank() == die["rank"]
            and self.trainer.current_epoch == die["epoch"]
            and batch_idx == 0
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("val_loss", loss, sync_dist=True)
        self.log("score", self.offset + loss, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def quiet_lightning() -> None:
    """Lightning's advice for small CPU runs (loader workers, logging interval) is noise."""
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*number of training batches.*")


def make_trainer(config: dict[str, Any]) -> pl.Trainer:
    """A quiet CPU trainer with lumos's strategy, environment and report callback."""
    callback = ReportCallback(
        checkpoint_upload_mode=config.get("upload_mode"),
        every_n_epochs=int(config.get("every_n_epochs", 1)),
    )
    return pl.Trainer(
        max_epochs=int(config["epochs"]),
        accelerator="cpu",
        devices=1,
        strategy=LumosDDPStrategy(),
        plugins=[RayLightningEnvironment()],  # Ray's name works too
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=config.get("root_dir"),
    )


def fit(config: dict[str, Any]) -> None:
    """The training function: fresh start or resume from ``train.get_checkpoint()``."""
    quiet_lightning()
    torch.manual_seed(0)
    trainer = prepare_trainer(make_trainer(config))
    model = Regression(
        lr=float(config.get("lr", 0.1)),
        offset=float(config.get("offset", 0.0)),
        die=config.get("die"),
    )
    train_set, val_set = datasets()
    with get_checkpoint_path() as ckpt_path:
        trainer.fit(
            model,
            train_dataloaders=DataLoader(train_set, batch_size=BATCH),
            val_dataloaders=DataLoader(val_set, batch_size=BATCH),
            ckpt_path=ckpt_path,
        )


class ShardedRegression(Regression):
    """``Regression`` with a two-layer MLP that ``configure_model`` shards with FSDP2.

    ``config["full_state_out"]``: rank 0 saves the full (gathered) parameters there when
    training ends; ``config["full_state_in"]``: at the start of training (after the
    checkpoint was loaded) every rank compares the gathered parameters with that file
    and logs ``restored_exact`` (1.0 when equal bit for bit).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(lr=float(config.get("lr", 0.02)))
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.config = config
        self.restored_exact = -1.0

    def configure_model(self) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(self.layer, FSDPModule):  # already sharded (a second fit)
            return
        mesh = self.device_mesh["data_parallel"]
        for part in (self.layer[0], self.layer[2]):
            fully_shard(part, mesh=mesh)
        fully_shard(self.layer, mesh=mesh)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered from all ranks (a collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        return {k: v.clone() for k, v in get_model_state_dict(self.layer, options=options).items()}

    def on_train_start(self) -> None:
        super().on_train_start()
        expected_path = self.config.get("full_state_in")
        if expected_path:
            expected = torch.load(expected_path, weights_only=True)
            now = self.full_parameters()
            same = set(now) == set(expected) and all(torch.equal(now[k], expected[k]) for k in now)
            self.restored_exact = 1.0 if same else 0.0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("restored_exact", self.restored_exact)
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        full = self.full_parameters()
        out = self.config.get("full_state_out")
        if out and train.get_context().get_world_rank() == 0:
            torch.save(full, out)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def fit_sharded(config: dict[str, Any]) -> None:
    """The training function with ``LumosModelParallelStrategy`` (FSDP2, DCP checkpoints)."""
    from lumos.train.lightning import LumosModelParallelStrategy

    quiet_lightning()
    torch.manual_seed(0)
    callback = ReportCallback(checkpoint_upload_mode=config.get("upload_mode"))
    trainer = pl.Trainer(
        max_epochs=int(config["epochs"]),
        accelerator="cpu",
        devices=1,
        strategy=LumosModelParallelStrategy(),
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=config.get("root_dir"),
    )
    trainer = prepare_trainer(trainer)
    train_set, val_set = datasets()
    with get_checkpoint_path() as ckpt_path:
        trainer.fit(
            ShardedRegression(config),
            train_dataloaders=DataLoader(train_set, batch_size=BATCH),
            val_dataloaders=DataLoader(val_set, batch_size=BATCH),
            ckpt_path=ckpt_path,
        )
    probe = config.get("probe_dir")
    if probe:  # each rank saves into a folder of its own: what lands where
        rank = train.get_context().get_world_rank()
        trainer.save_checkpoint(os.path.join(probe, f"rank{rank}", CHECKPOINT_NAME))
