"""Asynchronous checkpoint validation: Ray Train V2's ``ValidationConfig`` names.

``TorchTrainer(validation_config=train.ValidationConfig(fn))`` and
``train.report(..., validation=True)`` run ``fn(checkpoint, **fn_kwargs) -> dict`` as
its own Ray task once the report's checkpoint is committed, while training goes on.
The driver side is ``controller/validations.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.train._internal.errors import TrainConfigError, TrainTypeError

if TYPE_CHECKING:
    from lumos.storage import Checkpoint

ValidationFn = Callable[..., dict[str, Any]]
"""``fn(checkpoint, **fn_kwargs) -> dict`` of metrics."""


def _check_kwargs(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TrainTypeError(f"{field}={value!r} must be a dict with str keys (or None)")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TrainTypeError(
            f"{field}={value!r} must be JSON-serializable ({exc}): it is stored with the "
            "checkpoint so that a pending validation can run again after a driver restart"
        ) from None
    return dict(value)


def _check_timeout(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TrainTypeError(f"{field}={value!r} must be a number of seconds > 0, or None")
    if value <= 0:
        raise TrainConfigError(f"{field}={value!r} must be > 0 seconds, or None (no timeout)")
    return float(value)


def _check_remote_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse options Ray would refuse when the first validation starts."""
    try:
        from ray._common.ray_option_utils import validate_task_options
    except ImportError:  # pragma: no cover - another Ray release: Ray checks at launch
        return
    try:
        validate_task_options(kwargs, in_options=True)
    except (ValueError, TypeError) as exc:
        raise TrainConfigError(f"ValidationConfig(ray_remote_kwargs={kwargs!r}): {exc}") from None


class ValidationTaskConfig:
    """How one validation runs: its keyword arguments and its timeout.

    Given to ``ValidationConfig(task_config=...)`` as the default, or to
    ``train.report(..., validation=ValidationTaskConfig(...))`` for one report, whose
    ``fn_kwargs`` then override the default's key by key.

    Args:
        fn_kwargs: JSON-serializable keyword arguments for the validation function.
        timeout_s: The validation is cancelled after this many seconds and recorded as
            timed out (``ReportedCheckpointStatus.VALIDATION_TIMEOUT``); ``None``: no limit.

    Raises:
        TrainTypeError: ``fn_kwargs`` is not a JSON-serializable dict.
        TrainConfigError: ``timeout_s`` is not positive.

    Example:
        >>> ValidationTaskConfig(fn_kwargs={"split": "val"}, timeout_s=60).timeout_s
        60.0
    """

    def __init__(self, fn_kwargs: dict[str, Any] | None = None, timeout_s: float | None = None):
        self.fn_kwargs = _check_kwargs(fn_kwargs, "ValidationTaskConfig.fn_kwargs")
        self.timeout_s = _check_timeout(timeout_s, "ValidationTaskConfig.timeout_s")

    def __repr__(self) -> str:
        return f"ValidationTaskConfig(fn_kwargs={self.fn_kwargs!r}, timeout_s={self.timeout_s!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ValidationTaskConfig)
            and other.fn_kwargs == self.fn_kwargs
            and other.timeout_s == self.timeout_s
        )

    __hash__ = None  # type: ignore[assignment]


class ValidationConfig:
    """The validation function of a run, given to the trainer.

    Each ``train.report(..., checkpoint=..., validation=True)`` then runs
    ``fn(checkpoint, **fn_kwargs)`` as a Ray task of its own once the checkpoint is
    committed; training does not wait. The returned metrics are merged into that
    checkpoint's metrics (run state, ``Result.best_checkpoints``, the metrics history,
    ``get_all_reported_checkpoints``), so ``CheckpointConfig(checkpoint_score_attribute=
    "val_loss")`` ranks checkpoints by them. A validation that raises or times out is
    recorded on its checkpoint and does not stop training.

    Args:
        fn: ``fn(checkpoint, **fn_kwargs) -> dict`` of JSON-serializable metrics.
        task_config: Default ``fn_kwargs`` and ``timeout_s``.
        ray_remote_kwargs: Options of the validation's Ray task (``num_cpus``,
            ``num_gpus``, ``resources``, ``memory``, ...), as for ``ray.remote``.

    Raises:
        TrainTypeError: ``fn`` is not callable, or an argument has the wrong type.

    Example:
        >>> def validate(checkpoint, split="val"):
        ...     return {"val_loss": 0.1}
        >>> config = ValidationConfig(validate, ray_remote_kwargs={"num_cpus": 1})
    """

    def __init__(
        self,
        fn: ValidationFn,
        task_config: ValidationTaskConfig | None = None,
        ray_remote_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TrainTypeError(
                f"ValidationConfig(fn={fn!r}): fn must be callable, "
                "fn(checkpoint, **fn_kwargs) -> dict of metrics"
            )
        if task_config is not None and not isinstance(task_config, ValidationTaskConfig):
            raise TrainTypeError(
                f"ValidationConfig(task_config={task_config!r}) must be a "
                "train.ValidationTaskConfig or None"
            )
        if ray_remote_kwargs is not None and not isinstance(ray_remote_kwargs, dict):
            raise TrainTypeError(
                f"ValidationConfig(ray_remote_kwargs={ray_remote_kwargs!r}) must be a dict "
                "of ray.remote options or None"
            )
        self.fn = fn
        self.task_config = task_config or ValidationTaskConfig()
        self.ray_remote_kwargs = dict(ray_remote_kwargs or {})
        _check_remote_kwargs(self.ray_remote_kwargs)

    def __repr__(self) -> str:
        return (
            f"ValidationConfig(fn={self.fn!r}, task_config={self.task_config!r}, "
            f"ray_remote_kwargs={self.ray_remote_kwargs!r})"
        )

    def request(self, override: dict[str, Any] | None) -> dict[str, Any]:
        """The stored request of one validation: default kwargs and timeout, with
        a report's ``ValidationTaskConfig`` (``override``) applied on top."""
        kwargs = dict(self.task_config.fn_kwargs)
        timeout = self.task_config.timeout_s
        if override is not None:
            kwargs.update(override.get("fn_kwargs") or {})
            timeout = override.get("timeout_s", timeout)
        return {"fn_kwargs": kwargs, "timeout_s": timeout}


def report_validation_arg(value: Any) -> dict[str, Any] | None:
    """``train.report(validation=...)`` as it travels to the driver.

    ``False``/``None``: none; ``True``: the trainer's defaults (``{}``); a
    ``ValidationTaskConfig``: its fields (applied on top of the defaults).
    """
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, ValidationTaskConfig):
        out: dict[str, Any] = {"fn_kwargs": value.fn_kwargs}
        if value.timeout_s is not None:
            out["timeout_s"] = value.timeout_s
        return out
    raise TrainTypeError(
        f"train.report(validation={value!r}): pass True, False or a train.ValidationTaskConfig"
    )


def run_validation(fn: ValidationFn, checkpoint: Checkpoint, fn_kwargs: dict[str, Any]) -> Any:
    """The body of a validation task: call ``fn`` and check what it returned."""
    from lumos.train._internal.metrics_check import check_metrics

    metrics = fn(checkpoint, **fn_kwargs)
    if not isinstance(metrics, dict):
        raise TrainTypeError(
            f"the validation function {fn!r} returned {type(metrics).__name__}; it must "
            "return a dict of metrics"
        )
    check_metrics(metrics)
    return dict(metrics)


def warm_up(fn: ValidationFn) -> None:
    """A no-op task run when the run starts: the first validation then finds a worker
    process with lumos, its storage layer and ``fn`` already loaded."""
    import lumos.storage  # noqa: F401
    from lumos.train._internal import metrics_check  # noqa: F401
