"""``prepare_trainer``: check a Lightning ``Trainer`` for a lumos worker and give it lumos's ranks.

It accepts the two strategies that run on lumos's process group, DDP
(``strategy.py``) and FSDP2 (``model_parallel.py``), and names the way that works for
any other one, a sharded one included.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

from lumos.train._internal.api import get_context
from lumos.train._internal.errors import TrainConfigError, TrainTypeError
from lumos.train._internal.lightning.model_parallel import LumosModelParallelStrategy
from lumos.train._internal.lightning.strategy import LumosDDPStrategy, LumosLightningEnvironment

_SHARDED_HINT: tuple[tuple[type[object], str], ...] = (
    (
        FSDPStrategy,
        "Lightning's FSDPStrategy (FSDP1) runs only on GPU accelerators and is not "
        "wired to lumos's process group",
    ),
    (
        ModelParallelStrategy,
        "Lightning's own ModelParallelStrategy sizes its mesh from Lightning's nodes x "
        "devices and writes every rank's shards into rank 0's checkpoint folder",
    ),
    (DeepSpeedStrategy, "DeepSpeed is not wired to lumos's process group"),
)
"""Why a sharded Lightning strategy of Lightning's own does not run on a lumos worker."""


def _refusal(strategy: object) -> TrainConfigError:
    name = type(strategy).__name__
    hint = next((why for cls, why in _SHARDED_HINT if isinstance(strategy, cls)), None)
    sharded = (
        f" ({hint}); for sharded training use "
        "lumos.train.lightning.LumosModelParallelStrategy (FSDP2, fully_shard in "
        "configure_model; it runs on CPU workers too)"
        if hint is not None
        else ""
    )
    return TrainConfigError(
        f"Trainer(strategy=...) is a {name}{sharded}; lumos runs Lightning with "
        "lumos.train.lightning.LumosDDPStrategy (Ray's name: RayDDPStrategy) or "
        "LumosModelParallelStrategy, or a subclass: pl.Trainer(strategy=LumosDDPStrategy(), "
        "plugins=[LumosLightningEnvironment()], ...)"
    )


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check (and complete) a Lightning ``Trainer`` for a lumos training function.

    The trainer must use :class:`LumosDDPStrategy` or :class:`LumosModelParallelStrategy`
    (or a subclass). Its cluster environment becomes a :class:`LumosLightningEnvironment`
    when it is another one (Lightning picks ``LightningEnvironment`` when none is given):
    lumos's process group is already formed, and only lumos knows its ranks. Call it
    inside the training function, before ``trainer.fit``.

    Args:
        trainer: The ``lightning.pytorch.Trainer`` to run.

    Returns:
        The same trainer.

    Raises:
        TrainTypeError: ``trainer`` is not a ``lightning.pytorch.Trainer`` (a ``TypeError``).
        TrainConfigError: its strategy is neither of lumos's (a ``ValueError``); for
            Lightning's own sharded strategies the message says why and what to use.
        NotInTrainingFunctionError: called outside a training function.

    Example:
        >>> trainer = prepare_trainer(pl.Trainer(max_epochs=3,  # doctest: +SKIP
        ...     strategy=LumosDDPStrategy(), callbacks=[ReportCallback()]))
    """
    if not isinstance(trainer, pl.Trainer):
        raise TrainTypeError(
            f"prepare_trainer(trainer) needs a lightning.pytorch.Trainer, got "
            f"{type(trainer).__module__}.{type(trainer).__qualname__}"
        )
    strategy = trainer.strategy
    if not isinstance(strategy, LumosDDPStrategy | LumosModelParallelStrategy):
        raise _refusal(strategy)
    get_context()  # NotInTrainingFunctionError outside a training function
    if not isinstance(strategy.cluster_environment, LumosLightningEnvironment):
        strategy.cluster_environment = LumosLightningEnvironment()
    return trainer
