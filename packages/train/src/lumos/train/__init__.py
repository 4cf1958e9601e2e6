"""lumos.train: fault-tolerant distributed training on Ray.

Names are loaded on first use (PEP 562), so a worker process that only needs
``train.report`` does not pay for the driver-side machinery.

Example:
    >>> from lumos import train
    >>> from lumos.train.torch import TorchTrainer
    >>> def train_fn(config):
    ...     for step in range(config["steps"]):
    ...         train.report({"step": step})
    >>> result = TorchTrainer(train_fn, train_loop_config={"steps": 3},
    ...     scaling_config=train.ScalingConfig(num_workers=2)).fit()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime._internal.lazy import lazy_attributes
from lumos.train._version import __version__

if TYPE_CHECKING:
    from lumos.storage import Checkpoint, CheckpointConfig
    from lumos.train._internal.api import get_checkpoint, get_context, report
    from lumos.train._internal.callback import Callback
    from lumos.train._internal.config import (
        FailureConfig,
        RunConfig,
        ScalingConfig,
    )
    from lumos.train._internal.errors import (
        CheckpointReportError,
        TrainConfigError,
        TrainError,
        TrainingFailedError,
    )
    from lumos.train._internal.result import Result
    from lumos.train._internal.session import TrainContext
    from lumos.train._internal.trainer import DataParallelTrainer

_LAZY: dict[str, str] = {
    "Checkpoint": "lumos.storage",
    "get_checkpoint": "lumos.train._internal.api",
    "get_context": "lumos.train._internal.api",
    "report": "lumos.train._internal.api",
    "Callback": "lumos.train._internal.callback",
    "CheckpointConfig": "lumos.storage",
    "FailureConfig": "lumos.train._internal.config",
    "RunConfig": "lumos.train._internal.config",
    "ScalingConfig": "lumos.train._internal.config",
    "CheckpointReportError": "lumos.train._internal.errors",
    "TrainConfigError": "lumos.train._internal.errors",
    "TrainError": "lumos.train._internal.errors",
    "TrainingFailedError": "lumos.train._internal.errors",
    "Result": "lumos.train._internal.result",
    "TrainContext": "lumos.train._internal.session",
    "DataParallelTrainer": "lumos.train._internal.trainer",
}

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointReportError",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "TrainConfigError",
    "TrainContext",
    "TrainError",
    "TrainingFailedError",
    "__version__",
    "get_checkpoint",
    "get_context",
    "report",
]


__getattr__, __dir__ = lazy_attributes("lumos.train", _LAZY, globals(), __all__)
