"""Tune over Train: each trial is a 2-worker DDP run; the pruner sees every epoch.

The trial function only builds a ``TorchTrainer`` and calls ``fit()``. Inside a
trial, the Train run writes under the trial's directory, forwards rank 0's
reports to the trial (so the pruner and the progress table see them) and, when
the trial is pruned, stops its workers and ends the trial as PRUNED.

    python examples/tune_over_train.py
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import optuna
import ray
import torch
from torch.utils.data import DataLoader, TensorDataset

from lumos import train, tune
from lumos.train.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_fn_per_worker(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    loader = prepare_data_loader(
        DataLoader(TensorDataset(x, 3 * x - 1), batch_size=config["batch_size"], shuffle=True)
    )
    net = torch.nn.Linear(1, 1)
    model = prepare_model(net)  # DDP over the workers; net shares its weights
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    start = 0
    if (checkpoint := train.get_checkpoint()) is not None:  # a resumed sweep continues here
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        net.load_state_dict(state["model"])
        start = state["epoch"]
    for epoch in range(start + 1, 9):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as d:
            if train.get_context().get_world_rank() == 0:
                torch.save(
                    {"model": net.state_dict(), "epoch": epoch},
                    os.path.join(d, "state.pt"),
                )
            train.report(
                {"epoch": epoch, "loss": loss.item()},
                checkpoint=train.Checkpoint.from_directory(d),
            )


def trial(config: dict[str, Any]) -> None:
    # Nothing Tune-specific here: the run finds its trial through lumos.runtime.
    TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(checkpoint_config=train.CheckpointConfig(num_to_keep=1)),
    ).fit()


def main() -> None:
    # 2 trials x 2 workers at once; a trial's own actor only drives its run.
    ray.init(num_cpus=4, include_dashboard=False)
    grid = tune.Tuner(
        trial,
        param_space={"lr": tune.loguniform(1e-3, 0.5), "batch_size": tune.choice([16, 64])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=4,
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            sampler=optuna.samplers.TPESampler(seed=0),
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2),
        ),
        run_config=tune.RunConfig(
            storage_path=os.path.join(tempfile.gettempdir(), "lumos_examples")
        ),
    ).fit()
    best = grid.get_best_result()
    run = train.Result.from_path(f"{best.path}/train")  # the best trial's Train run
    print(f"best config: {best.config}  loss={best.metrics['loss']:.4f}")
    print(f"its checkpoint: {run.checkpoint.path if run.checkpoint else None}")
    print(grid.get_dataframe()[["trial_id", "status", "epoch", "loss"]])
    for error in grid.errors:
        print(error)
    ray.shutdown()


if __name__ == "__main__":
    main()
