"""A small PyTorch classifier for scikit-learn's bundled digits (8x8 images, 10 classes).

Shared by ``demo_tune_over_train.py``, ``tune_over_train.py`` and the integration
tests: the data splits, the model, the per-worker training loop (DDP through
``lumos.train.torch``, a checkpoint every epoch, resume from the latest
checkpoint) and the evaluation of a checkpoint. Nothing is downloaded:
``sklearn.datasets.load_digits`` ships with scikit-learn.

Example:
    >>> from digits import load_splits, make_model, accuracy
    >>> splits = load_splits()
    >>> model = make_model(width=64)
    >>> 0.0 <= accuracy(model, splits.x_test, splits.y_test) <= 1.0
    True
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: File inside every checkpoint of ``train_fn_per_worker``.
CHECKPOINT_FILE = "model.pt"


@dataclass(frozen=True)
class Splits:
    """Train / validation / test tensors (pixels scaled to [0, 1]).

    The test split is held out: tuning sees only the validation accuracy.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@functools.lru_cache(maxsize=2)
def load_splits(seed: int = 0) -> Splits:
    """Load digits and split it 60 / 20 / 20 (stratified, fixed by ``seed``).

    Cached per process: importing scikit-learn takes seconds on a busy machine, so
    a trial loads the data once and hands it to its workers in the config.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype("float32") / 16.0  # pixel values are 0..16
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=seed
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=0.25, stratify=y_rest, random_state=seed
    )

    def t(a: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype)

    return Splits(
        t(x_train, torch.float32),
        t(y_train, torch.long),
        t(x_val, torch.float32),
        t(y_val, torch.long),
        t(x_test, torch.float32),
        t(y_test, torch.long),
    )


def make_model(width: int) -> nn.Module:
    """A two-layer MLP: 64 pixels -> ``width`` hidden units -> 10 classes."""
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` that ``model`` classifies as ``y``."""
    model.eval()
    correct = (model(x).argmax(dim=1) == y).sum().item()
    model.train()
    return float(correct) / len(y)


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """The training loop every Train worker runs (DDP over the workers).

    ``config``: ``lr``, ``width``, ``batch_size``, ``epochs``, optionally ``seed``
    and ``data`` (a :class:`Splits`; loaded here when absent). Each epoch reports
    ``epoch`` (1-based), ``val_accuracy`` and ``loss`` with a checkpoint named
    ``epoch=<n>``; after a restart or a resumed sweep it continues from the latest
    committed checkpoint.
    """
    from torch.utils.data import DataLoader, TensorDataset

    from lumos import train
    from lumos.train.torch import prepare_data_loader, prepare_model

    torch.set_num_threads(1)  # several workers share a 2-core machine
    torch.manual_seed(int(config.get("seed", 0)))
    splits: Splits = config["data"] if "data" in config else load_splits()
    width = int(config["width"])
    net = make_model(width)
    model = prepare_model(net)  # DDP: rank 0's initial weights everywhere; net shares them
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
    loader = prepare_data_loader(
        DataLoader(
            TensorDataset(splits.x_train, splits.y_train),
            batch_size=int(config["batch_size"]),
            shuffle=True,
        )
    )

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, CHECKPOINT_FILE), weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["epoch"])

    loss_fn = nn.CrossEntropyLoss()
    rank = train.get_context().get_world_rank()
    for epoch in range(start + 1, int(config["epochs"]) + 1):
        total, batches = 0.0, 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.item())
            batches += 1
        metrics = {
            "epoch": epoch,
            "loss": total / max(batches, 1),
            "val_accuracy": accuracy(net, splits.x_val, splits.y_val),
        }
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:  # DDP keeps the weights equal; one copy is enough
                torch.save(
                    {
                        "model": net.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "epoch": epoch,
                        "width": width,
                    },
                    os.path.join(d, CHECKPOINT_FILE),
                )
            train.report(
                metrics,
                checkpoint=train.Checkpoint.from_directory(d),
                checkpoint_dir_name=f"epoch={epoch}",
            )


def load_model(checkpoint: Any) -> tuple[nn.Module, int]:
    """The model saved in a checkpoint of ``train_fn_per_worker`` and its epoch.

    Args:
        checkpoint: a ``lumos.storage.Checkpoint`` (``train.Checkpoint``, ``tune.Checkpoint``).
    """
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, CHECKPOINT_FILE), weights_only=True)
    model = make_model(int(state["width"]))
    model.load_state_dict(state["model"])
    return model, int(state["epoch"])


def evaluate_checkpoint(checkpoint: Any) -> float:
    """Accuracy on the held-out test split of the model in ``checkpoint``."""
    model, _ = load_model(checkpoint)
    splits = load_splits()
    return accuracy(model, splits.x_test, splits.y_test)
