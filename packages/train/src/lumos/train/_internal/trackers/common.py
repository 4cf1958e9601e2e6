"""What the MLflow and W&B integrations of Train share."""

from __future__ import annotations

import math
import tempfile
from typing import Any

from lumos.storage import Checkpoint
from lumos.train._internal.api import get_context
from lumos.train._internal.errors import NotInTrainingFunctionError


def flat(
    values: dict[str, Any], into: dict[str, Any] | None = None, at: str = ""
) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    out = {} if into is None else into
    for name, value in values.items():
        if isinstance(value, dict):
            flat(value, out, f"{at}{name}/")
        else:
            out[at + name] = value
    return out


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite int / float entries of flattened ``metrics`` (no bools, no text)."""
    return {
        k: float(v)
        for k, v in flat(metrics).items()
        if type(v) in (int, float) and math.isfinite(v)
    }


def local_dir(checkpoint: Checkpoint) -> tuple[str, bool]:
    """A local directory with the checkpoint's files, and whether it is a temporary copy."""
    if checkpoint.is_local():
        return checkpoint.path, False
    return checkpoint.to_directory(tempfile.mkdtemp(prefix="lumos-tracker-")), True


def end_status(error: BaseException | None) -> str:
    """MLflow's run status for how ``fit()`` ended."""
    if error is None:
        return "FINISHED"
    return "KILLED" if isinstance(error, KeyboardInterrupt | SystemExit) else "FAILED"


def rank_zero(rank_zero_only: bool) -> bool:
    """Whether this process should log: rank 0, any rank with ``rank_zero_only=False``, or
    a process outside a training function."""
    if not rank_zero_only:
        return True
    try:
        return get_context().get_world_rank() == 0
    except NotInTrainingFunctionError:  # the driver, a notebook
        return True


def run_name_default() -> str | None:
    """The Train run's name inside a training function, else ``None``."""
    try:
        return get_context().get_run_name()
    except NotInTrainingFunctionError:
        return None


class NoopModule:
    """Stands in for the tracker on ranks that do not log: every attribute is a function
    that does nothing and returns ``None`` (as Ray's ``_NoopModule``)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None
