"""lumos.train.torch: PyTorch data-parallel training (DDP, FSDP2) and sharded checkpoints.

Example:
    >>> from lumos import train
    >>> from lumos.train.torch import TorchTrainer, prepare_model, prepare_data_loader
    >>> def train_fn(config):
    ...     model = prepare_model(torch.nn.Linear(4, 1))
    ...     ...
    >>> TorchTrainer(train_fn, scaling_config=train.ScalingConfig(num_workers=2)).fit()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime import lazy_attributes

if TYPE_CHECKING:
    from lumos.train._internal.torch.config import TorchConfig as TorchConfig
    from lumos.train._internal.torch.sharded import (
        gather_full_state as gather_full_state,
        load_sharded_state as load_sharded_state,
        save_sharded_state as save_sharded_state,
    )
    from lumos.train._internal.torch.torchft_config import TorchftConfig as TorchftConfig
    from lumos.train._internal.torch.torchft_loop import (
        FaultTolerantOptimizer as FaultTolerantOptimizer,
        TorchftTraining as TorchftTraining,
        prepare_torchft as prepare_torchft,
    )
    from lumos.train._internal.torch.trainer import TorchTrainer as TorchTrainer
    from lumos.train._internal.torch.utils import (
        get_device as get_device,
        prepare_data_loader as prepare_data_loader,
        prepare_model as prepare_model,
    )

# loaded on first use: a worker that only calls prepare_model does not import the trainer
_LAZY: dict[str, str] = {
    "TorchConfig": "lumos.train._internal.torch.config",
    "TorchTrainer": "lumos.train._internal.torch.trainer",
    "TorchftConfig": "lumos.train._internal.torch.torchft_config",
    "TorchftTraining": "lumos.train._internal.torch.torchft_loop",
    "FaultTolerantOptimizer": "lumos.train._internal.torch.torchft_loop",
    "prepare_torchft": "lumos.train._internal.torch.torchft_loop",
    "gather_full_state": "lumos.train._internal.torch.sharded",
    "get_device": "lumos.train._internal.torch.utils",
    "load_sharded_state": "lumos.train._internal.torch.sharded",
    "prepare_data_loader": "lumos.train._internal.torch.utils",
    "prepare_model": "lumos.train._internal.torch.utils",
    "save_sharded_state": "lumos.train._internal.torch.sharded",
}

__getattr__, __dir__, __all__ = lazy_attributes("lumos.train.torch", _LAZY, globals())
