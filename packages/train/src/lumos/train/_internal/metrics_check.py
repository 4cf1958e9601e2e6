"""Refuse metrics that cannot be stored: torch tensors and values JSON cannot hold.

The rule for numbers follows ``lumos.storage.to_jsonable``: plain ``bool`` / ``int`` /
``float`` / ``str`` / ``None`` pass as they are, and so do scalars with ``.item()``
(numpy numbers) that are not torch tensors. A tensor is refused with a hint to call
``.item()`` (as Ray does: a tensor in the metrics would pin device memory and fail to
load where torch or the device is missing). Lists and dicts must hold such values.

torch is never imported here: a tensor can only exist once the user imported torch,
so ``sys.modules.get("torch")`` tells whether there is anything to look for.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lumos.train._internal.errors import TrainTypeError

_PLAIN = (bool, int, float, str, type(None))


def check_metrics(metrics: dict[str, Any]) -> None:
    """Raise ``TrainTypeError`` naming the first key whose value cannot be stored.

    Example:
        >>> check_metrics({"loss": 0.5, "step": 3, "tags": ["a", "b"]})
        >>> check_metrics({"obj": object()})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lumos.train._internal.errors.TrainTypeError: train.report(metrics): metrics['obj'] ...
    """
    for key, value in metrics.items():
        if type(value) in _PLAIN:
            continue
        _check_value(key, value)


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _check_value(key: Any, value: Any) -> None:
    if not isinstance(key, str):
        raise TrainTypeError(
            f"train.report(metrics): key {key!r} is a {type(key).__name__}; metric names "
            "must be strings"
        )

    def default(obj: Any) -> Any:
        if _is_tensor(obj):
            raise TrainTypeError(
                f"train.report(metrics): metrics[{key!r}] holds a torch.Tensor "
                f"(shape {tuple(obj.shape)}); convert it to a Python number with "
                f"`.item()` (or a list with `.tolist()`), or save tensors in the checkpoint"
            )
        item = getattr(obj, "item", None)
        if callable(item):
            try:
                return item()
            except (TypeError, ValueError):
                pass
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        raise TypeError(type(obj).__name__)

    try:
        json.dumps(value, default=default)
    except TrainTypeError:
        raise
    except (TypeError, ValueError) as exc:
        raise TrainTypeError(
            f"train.report(metrics): metrics[{key!r}] = {_short(value)} cannot be stored as "
            f"JSON ({exc}); report numbers, strings, booleans, None, or lists/dicts of them"
        ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
