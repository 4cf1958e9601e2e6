"""lumos.train.huggingface.transformers: a Hugging Face ``transformers.Trainer`` under lumos.

Needs the extra: ``pip install 'lumos-train[transformers]'`` (transformers, accelerate).

Example:
    >>> from lumos.train.huggingface.transformers import ReportCallback, prepare_trainer
    >>> def train_fn(config):
    ...     args = transformers.TrainingArguments("out", use_cpu=True, save_steps=10)
    ...     trainer = transformers.Trainer(model, args, train_dataset=ds,
    ...         callbacks=[ReportCallback()])
    ...     prepare_trainer(trainer).train()
    >>> TorchTrainer(train_fn, scaling_config=train.ScalingConfig(num_workers=2)).fit()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime import lazy_attributes

if TYPE_CHECKING:
    from lumos.train._internal.hf_transformers import (
        RayTrainReportCallback as RayTrainReportCallback,
        ReportCallback as ReportCallback,
        prepare_trainer as prepare_trainer,
    )

_MODULE = "lumos.train._internal.hf_transformers"

# loaded on first use: importing this package does not import transformers
_LAZY: dict[str, str] = {
    "RayTrainReportCallback": _MODULE,
    "ReportCallback": _MODULE,
    "prepare_trainer": _MODULE,
}

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.train.huggingface.transformers", _LAZY, globals()
)
