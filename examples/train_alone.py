"""lumos.train alone: a 2-worker DDP run with checkpoints, retries and a resumable name.

Fits y = 3x - 1 with a one-weight linear model on two CPU workers. Run it twice:
the second run finds the finished run under the same ``RunConfig(storage_path,
name)`` and returns its result without training again.

    python examples/train_alone.py
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ray
import torch
from torch.utils.data import DataLoader, TensorDataset

from lumos import train
from lumos.train.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_fn_per_worker(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    data = TensorDataset(x, 3 * x - 1)
    loader = prepare_data_loader(DataLoader(data, batch_size=32, shuffle=True))
    net = torch.nn.Linear(1, 1)
    model = prepare_model(net)  # DDP: gradients averaged over workers; net shares its weights
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])

    start = 0
    if (checkpoint := train.get_checkpoint()) is not None:  # after a failure or a resume
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        net.load_state_dict(state["model"])
        start = state["epoch"]

    for epoch in range(start + 1, config["epochs"] + 1):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as d:
            if train.get_context().get_world_rank() == 0:  # one copy of the DDP weights
                torch.save(
                    {"model": net.state_dict(), "epoch": epoch},
                    os.path.join(d, "state.pt"),
                )
            train.report(
                {"epoch": epoch, "loss": loss.item()},
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"epoch={epoch}",
            )


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    storage = os.path.join(tempfile.gettempdir(), "lumos_examples")
    result = TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"lr": 0.1, "epochs": 5},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="train-alone",
            storage_path=storage,
            failure_config=train.FailureConfig(max_failures=2),
            checkpoint_config=train.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    print(f"final metrics: {result.metrics}")
    print(f"latest checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    print(result.metrics_dataframe)
    ray.shutdown()


if __name__ == "__main__":
    main()
