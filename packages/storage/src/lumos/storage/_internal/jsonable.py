"""One rule for turning metric values into JSON (numpy and torch scalars become numbers)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def json_default(value: Any) -> Any:
    """``json.dumps(..., default=json_default)``: scalars with ``.item()`` become numbers,
    paths become strings, anything else its ``repr``.

    Example:
        >>> import json, pathlib
        >>> json.dumps({"p": pathlib.PurePosixPath("/a")}, default=json_default)
        '{"p": "/a"}'
    """
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


def to_jsonable(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a flat metrics dict whose values JSON can hold, by ``json_default``'s rule.

    Example:
        >>> to_jsonable({"loss": 0.5, "ok": True, "obj": object()})["loss"]
        0.5
    """
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, bool | int | float | str) or value is None:
            out[key] = value
        else:
            out[key] = json_default(value)
    return out
