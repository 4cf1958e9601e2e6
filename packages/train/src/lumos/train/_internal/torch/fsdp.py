"""``prepare_model(parallel_strategy="fsdp")``: FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each rank keeps only its shard of every parameter (a ``DTensor`` over a 1-D device mesh of
all ranks), gathers a layer's full parameters for its forward and backward, and
reduce-scatters the gradients. It runs on gloo (CPU) and NCCL (GPU) alike. The model is
sharded in place: ``fully_shard`` is applied to the submodules ``shard_modules`` selects
(one communication unit each, so only one of them is ever gathered at a time), then to
the root, and the same module object comes back (its class is now a subclass of
``FSDPModule``). Save and load it with ``save_sharded_state`` / ``load_sharded_state``
(``sharded.py``), which also reshard to another world size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lumos.train._internal.errors import TrainConfigError, TrainTypeError

FSDP_KWARGS: dict[str, str] = {
    "mesh": "a torch DeviceMesh (default: a 1-D mesh over every rank on this device type)",
    "reshard_after_forward": "bool or int, as fully_shard's (default True)",
    "mp_policy": "a torch.distributed.fsdp.MixedPrecisionPolicy",
    "offload_policy": "a torch.distributed.fsdp.CPUOffloadPolicy (or OffloadPolicy)",
    "shard_modules": (
        "a tuple of module classes, or fn(module) -> bool: the submodules sharded on their "
        "own before the root (e.g. (TransformerBlock,)); default: none, only the root"
    ),
}
"""The ``parallel_strategy_kwargs`` that ``parallel_strategy="fsdp"`` accepts."""

ShardSelector = tuple[type[torch.nn.Module], ...] | Callable[[torch.nn.Module], bool]


def check_fsdp_kwargs(kwargs: dict[str, Any]) -> None:
    """Raise ``TrainConfigError`` naming any key of ``kwargs`` that FSDP2 does not take.

    Example:
        >>> check_fsdp_kwargs({"reshard_after_forward": False})
        >>> check_fsdp_kwargs({"device_ids": [0]})  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        TrainConfigError: ...
    """
    unknown = sorted(set(kwargs) - set(FSDP_KWARGS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in FSDP_KWARGS.items())
        raise TrainConfigError(
            f"prepare_model(parallel_strategy='fsdp', parallel_strategy_kwargs=...): "
            f"{', '.join(repr(k) for k in unknown)} do(es) not apply to FSDP2; allowed are "
            f"{allowed}"
        )


def _selector(value: Any) -> Callable[[torch.nn.Module], bool]:
    if value is None:
        return lambda _m: False
    if isinstance(value, tuple) and all(
        isinstance(c, type) and issubclass(c, torch.nn.Module) for c in value
    ):
        return lambda m: isinstance(m, value)
    if callable(value) and not isinstance(value, type):
        return value  # type: ignore[no-any-return]
    raise TrainTypeError(
        f"parallel_strategy_kwargs['shard_modules']={value!r}: expected a tuple of "
        "torch.nn.Module classes or a function (module) -> bool"
    )


def _check_policies(kwargs: dict[str, Any]) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    checks = (("mp_policy", MixedPrecisionPolicy), ("offload_policy", OffloadPolicy))
    for key, cls in checks:
        if key in kwargs and not isinstance(kwargs[key], cls):
            raise TrainTypeError(
                f"parallel_strategy_kwargs[{key!r}]={kwargs[key]!r}: expected a "
                f"torch.distributed.fsdp.{cls.__name__}"
            )


def default_mesh(device: torch.device, world: int) -> Any:
    """A 1-D device mesh over all ``world`` ranks on ``device``'s type."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def shard_model(
    model: torch.nn.Module, kwargs: dict[str, Any], device: torch.device, world: int
) -> torch.nn.Module:
    """Apply FSDP2 to ``model`` in place (the submodules ``shard_modules`` picks, then the root).

    Args:
        model: the model, already on ``device``.
        kwargs: ``parallel_strategy_kwargs`` (keys of :data:`FSDP_KWARGS`).
        device: this rank's device.
        world: the world size.

    Returns:
        ``model`` itself, now an ``FSDPModule``.

    Raises:
        TrainConfigError: a key of ``kwargs`` does not apply to FSDP2.
        TrainTypeError: a value has the wrong type.
    """
    from torch.distributed.fsdp import fully_shard

    check_fsdp_kwargs(kwargs)
    _check_policies(kwargs)
    options = dict(kwargs)
    pick = _selector(options.pop("shard_modules", None))
    if options.get("mesh") is None:
        options["mesh"] = default_mesh(device, world)
    for name, sub in reversed(list(model.named_modules())):  # children before parents
        if name and pick(sub):
            fully_shard(sub, **options)
    fully_shard(model, **options)
    return model
