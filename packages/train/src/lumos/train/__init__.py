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

from lumos.runtime import lazy_attributes
from lumos.train._version import __version__ as __version__

if TYPE_CHECKING:
    from lumos.runtime import PreemptionInfo as PreemptionInfo
    from lumos.storage import Checkpoint as Checkpoint, CheckpointConfig as CheckpointConfig
    from lumos.train._internal.api import (
        get_all_reported_checkpoints as get_all_reported_checkpoints,
        get_checkpoint as get_checkpoint,
        get_context as get_context,
        get_dataset_shard as get_dataset_shard,
        get_preemption_info as get_preemption_info,
        report as report,
    )
    from lumos.train._internal.callback import Callback as Callback
    from lumos.train._internal.config import (
        FailureConfig as FailureConfig,
        RunConfig as RunConfig,
        ScalingConfig as ScalingConfig,
    )
    from lumos.train._internal.data_config import DataConfig as DataConfig
    from lumos.train._internal.errors import (
        CheckpointReportError as CheckpointReportError,
        ControllerError as ControllerError,
        NotInTrainingFunctionError as NotInTrainingFunctionError,
        RankStuckError as RankStuckError,
        TrainConfigError as TrainConfigError,
        TrainError as TrainError,
        TrainingFailedError as TrainingFailedError,
        TrainTypeError as TrainTypeError,
        WorkerGroupError as WorkerGroupError,
    )
    from lumos.train._internal.health import (
        HealthReport as HealthReport,
        MetricSpike as MetricSpike,
        NonFiniteMetric as NonFiniteMetric,
        Rollback as Rollback,
        RollbackInfo as RollbackInfo,
    )
    from lumos.train._internal.report_config import (
        CheckpointConsistencyMode as CheckpointConsistencyMode,
        CheckpointUploadMode as CheckpointUploadMode,
        ReportedCheckpoint as ReportedCheckpoint,
        ReportedCheckpointStatus as ReportedCheckpointStatus,
    )
    from lumos.train._internal.result import Result as Result
    from lumos.train._internal.train_context import TrainContext as TrainContext
    from lumos.train._internal.trainer import DataParallelTrainer as DataParallelTrainer
    from lumos.train._internal.user_callback import (
        TrainRunContext as TrainRunContext,
        UserCallback as UserCallback,
    )
    from lumos.train._internal.validation import (
        ValidationConfig as ValidationConfig,
        ValidationTaskConfig as ValidationTaskConfig,
    )

_LAZY: dict[str, str] = {
    "Checkpoint": "lumos.storage",
    "get_all_reported_checkpoints": "lumos.train._internal.api",
    "get_checkpoint": "lumos.train._internal.api",
    "get_context": "lumos.train._internal.api",
    "get_preemption_info": "lumos.train._internal.api",
    "PreemptionInfo": "lumos.runtime",
    "get_dataset_shard": "lumos.train._internal.api",
    "DataConfig": "lumos.train._internal.data_config",
    "report": "lumos.train._internal.api",
    "Callback": "lumos.train._internal.callback",
    "CheckpointConfig": "lumos.storage",
    "FailureConfig": "lumos.train._internal.config",
    "RunConfig": "lumos.train._internal.config",
    "ScalingConfig": "lumos.train._internal.config",
    "CheckpointReportError": "lumos.train._internal.errors",
    "ControllerError": "lumos.train._internal.errors",
    "NotInTrainingFunctionError": "lumos.train._internal.errors",
    "TrainConfigError": "lumos.train._internal.errors",
    "TrainTypeError": "lumos.train._internal.errors",
    "TrainError": "lumos.train._internal.errors",
    "RankStuckError": "lumos.train._internal.errors",
    "TrainingFailedError": "lumos.train._internal.errors",
    "WorkerGroupError": "lumos.train._internal.errors",
    "CheckpointConsistencyMode": "lumos.train._internal.report_config",
    "CheckpointUploadMode": "lumos.train._internal.report_config",
    "ReportedCheckpoint": "lumos.train._internal.report_config",
    "ReportedCheckpointStatus": "lumos.train._internal.report_config",
    "Result": "lumos.train._internal.result",
    "TrainContext": "lumos.train._internal.train_context",
    "DataParallelTrainer": "lumos.train._internal.trainer",
    "HealthReport": "lumos.train._internal.health",
    "MetricSpike": "lumos.train._internal.health",
    "NonFiniteMetric": "lumos.train._internal.health",
    "Rollback": "lumos.train._internal.health",
    "RollbackInfo": "lumos.train._internal.health",
    "TrainRunContext": "lumos.train._internal.user_callback",
    "UserCallback": "lumos.train._internal.user_callback",
    "ValidationConfig": "lumos.train._internal.validation",
    "ValidationTaskConfig": "lumos.train._internal.validation",
}

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.train", _LAZY, globals(), eager=("__version__",)
)
