"""Lightning under Tune over Train: a pruned trial's Lightning run stops cleanly.

Each trial runs a 2-worker ``TorchTrainer`` whose training function fits a Lightning
module with ``lumos.train.lightning``; ``ReportCallback`` reports each epoch's
``score`` and the pruner stops the bad trial at its first report. The trial ends
PRUNED (not errored), its Train run ``aborted`` with its committed checkpoints kept
and nothing uncommitted left, and no worker left alive.
"""

from __future__ import annotations

from typing import Any

from it_helpers import assert_pruned_run_stopped, sweep_good_and_bad

from lumos import train, tune
from lumos.train.torch import TorchTrainer

MAX_EPOCHS = 200  # a pruned run must stop far earlier
GOOD_EPOCHS = 2
UPPER = 5.0  # the pruner's threshold on score = offset + val_loss
# The shared 2-core box runs several Ray clusters at once: a busy actor may answer late.
PATIENT_S = 120.0


def lightning_fit(config: dict[str, Any]) -> None:
    """The Train function: a Lightning fit that resumes from the run's checkpoint.

    Lightning is imported here, on the Train workers only: the trial's actor, which
    imports this module to run ``_trial``, stays light.
    """
    import warnings

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lumos.train.lightning import (
        LumosDDPStrategy,
        ReportCallback,
        get_checkpoint_path,
        prepare_trainer,
    )

    class Scored(pl.LightningModule):
        """Linear regression whose reported ``score`` is ``offset + val_loss``."""

        def __init__(self, offset: float) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.offset = offset

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("score", self.offset + loss, sync_dist=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, 0.25 * x.sum(dim=1, keepdim=True))  # val_loss < 2 from the start
    trainer = prepare_trainer(  # no plugins: prepare_trainer sets lumos's environment
        pl.Trainer(
            max_epochs=int(config["epochs"]),
            accelerator="cpu",
            devices=1,
            strategy=LumosDDPStrategy(),
            callbacks=[ReportCallback()],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    )
    with get_checkpoint_path() as ckpt_path:
        trainer.fit(
            Scored(float(config["offset"])),
            train_dataloaders=DataLoader(data, batch_size=8),
            val_dataloaders=DataLoader(data, batch_size=8),
            ckpt_path=ckpt_path,
        )


def _trial(config: dict[str, float]) -> None:
    epochs = GOOD_EPOCHS if config["offset"] < UPPER else MAX_EPOCHS
    TorchTrainer(
        lightning_fit,
        train_loop_config={"offset": config["offset"], "epochs": epochs},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            verbose=False, failure_config=train.FailureConfig(health_check_timeout_s=PATIENT_S)
        ),
    ).fit()


def test_pruning_stops_a_lightning_run_cleanly(ray_cluster: str, storage_dir: str) -> None:
    _, good, bad = sweep_good_and_bad(
        _trial,
        "pl-prune",
        storage_dir,
        key="offset",
        good=0.0,
        bad=10.0,
        metric="score",
        upper=UPPER,
        run_config={"failure_config": tune.FailureConfig(health_check_timeout_s=PATIENT_S)},
    )
    assert good.metrics["epoch"] == GOOD_EPOCHS - 1
    assert bad.error is None
    good_run, bad_run = assert_pruned_run_stopped(storage_dir, "pl-prune", good, bad)
    epochs = [row["epoch"] for row in bad_run.read_metrics()]
    assert 1 <= len(epochs) < MAX_EPOCHS
    assert epochs == list(range(len(epochs)))
    good_state = good_run.load_state()
    assert good_state is not None
    assert [c.metrics["epoch"] for c in good_state.live_checkpoints()] == [0, 1]
    # ray_cluster's teardown: no worker actor or placement group left alive
