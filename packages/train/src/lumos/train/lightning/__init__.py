"""lumos.train.lightning: PyTorch Lightning on lumos (extra: ``lumos-train[lightning]``).

Ray Train's names work too: ``RayTrainReportCallback``, ``RayDDPStrategy``,
``RayLightningEnvironment``. Sharded models: ``LumosModelParallelStrategy`` (Lightning's
FSDP2 ``ModelParallelStrategy``, DCP checkpoints; CPU workers too). Importing this module without Lightning installed
raises an ``ImportError`` that names the extra.

Example:
    >>> import lightning.pytorch as pl
    >>> from lumos.train.lightning import (LumosDDPStrategy, LumosLightningEnvironment,
    ...     ReportCallback, get_checkpoint_path, prepare_trainer)
    >>> def train_fn(config):
    ...     trainer = prepare_trainer(pl.Trainer(max_epochs=config["epochs"],
    ...         strategy=LumosDDPStrategy(), plugins=[LumosLightningEnvironment()],
    ...         callbacks=[ReportCallback()], enable_checkpointing=False))
    ...     with get_checkpoint_path() as ckpt_path:  # None on a fresh start
    ...         trainer.fit(MyModule(), datamodule=MyData(), ckpt_path=ckpt_path)
    >>> TorchTrainer(train_fn, train_loop_config={"epochs": 5},  # doctest: +SKIP
    ...     scaling_config=train.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime import lazy_attributes
from lumos.train._internal.extras import require_extra

# before anything subclasses Lightning's classes: an ImportError naming the extra
require_extra("lightning.pytorch", "lightning", "lumos.train.lightning", "PyTorch Lightning")

if TYPE_CHECKING:
    from lumos.train._internal.lightning.callback import (
        CHECKPOINT_NAME as CHECKPOINT_NAME,
        RayTrainReportCallback as RayTrainReportCallback,
        ReportCallback as ReportCallback,
        get_checkpoint_path as get_checkpoint_path,
    )
    from lumos.train._internal.lightning.model_parallel import (
        LumosModelParallelStrategy as LumosModelParallelStrategy,
    )
    from lumos.train._internal.lightning.prepare import prepare_trainer as prepare_trainer
    from lumos.train._internal.lightning.strategy import (
        LumosDDPStrategy as LumosDDPStrategy,
        LumosLightningEnvironment as LumosLightningEnvironment,
        RayDDPStrategy as RayDDPStrategy,
        RayLightningEnvironment as RayLightningEnvironment,
    )

_CALLBACK = "lumos.train._internal.lightning.callback"
_STRATEGY = "lumos.train._internal.lightning.strategy"
_SHARDED = "lumos.train._internal.lightning.model_parallel"

_LAZY: dict[str, str] = {
    "CHECKPOINT_NAME": _CALLBACK,
    "RayTrainReportCallback": _CALLBACK,
    "ReportCallback": _CALLBACK,
    "get_checkpoint_path": _CALLBACK,
    "LumosDDPStrategy": _STRATEGY,
    "LumosLightningEnvironment": _STRATEGY,
    "LumosModelParallelStrategy": _SHARDED,
    "RayDDPStrategy": _STRATEGY,
    "RayLightningEnvironment": _STRATEGY,
    "prepare_trainer": "lumos.train._internal.lightning.prepare",
}

__getattr__, __dir__, __all__ = lazy_attributes("lumos.train.lightning", _LAZY, globals())
