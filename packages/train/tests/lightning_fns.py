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
