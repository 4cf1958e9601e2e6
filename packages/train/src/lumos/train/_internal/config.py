"""User-facing configuration models (pydantic).

Invalid values fail at construction with a message that names the field, the
value and what is allowed.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lumos.runtime import (
    FailureConfig as BaseFailureConfig,
    PlacementStrategy,
    RunConfig as BaseRunConfig,
    validate_resources,
)
from lumos.train._internal.callback import Callback


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class ScalingConfig(_Config):
    """How many workers to run and what each one needs.

    Args:
        num_workers: number of training workers (one process each), at least 1.
        use_gpu: give each worker one GPU (``resources_per_worker["GPU"]``
            defaults to 1) and use NCCL in ``TorchTrainer``.
        resources_per_worker: Ray resources per worker, e.g.
            ``{"CPU": 2, "GPU": 1}``. Default: 1 CPU (plus 1 GPU with
            ``use_gpu``).
        placement_strategy: Ray placement-group strategy for the workers:
            ``"PACK"`` (default), ``"SPREAD"``, ``"STRICT_PACK"`` or
            ``"STRICT_SPREAD"``.

    Example:
        >>> ScalingConfig(num_workers=4, use_gpu=True).worker_resources()
        {'CPU': 1.0, 'GPU': 1.0}
    """

    num_workers: int = Field(default=1, ge=1)
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: PlacementStrategy = "PACK"

    @field_validator("resources_per_worker")
    @classmethod
    def _check_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            validate_resources(value, "resources_per_worker", allow_zero=True)
        return value

    @model_validator(mode="after")
    def _check_gpu(self) -> ScalingConfig:
        gpus = (self.resources_per_worker or {}).get("GPU", 0)
        if gpus > 0 and not self.use_gpu:
            raise ValueError(
                f"resources_per_worker={{'GPU': {gpus}}} asks for GPUs but use_gpu=False; "
                "set ScalingConfig(use_gpu=True) to train on GPUs"
            )
        return self

    def worker_resources(self) -> dict[str, float]:
        """The Ray resources one worker reserves."""
        resources = {k: float(v) for k, v in (self.resources_per_worker or {}).items()}
        resources.setdefault("CPU", 1.0)
        if self.use_gpu:
            resources.setdefault("GPU", 1.0)
        return resources


class FailureConfig(BaseFailureConfig):
    """What to do when a worker fails.

    Extends ``lumos.runtime.FailureConfig`` (``max_failures``,
    ``health_check_timeout_s``) with how a run restarts.

    Args:
        max_failures: how many failures the run may recover from by restarting
            from its latest committed checkpoint: ``0`` (default) fails on the
            first error, ``-1`` retries forever.
        restart_strategy: ``"replace_failed"`` (default) replaces only the
            failed workers; the surviving workers keep their processes (and
            their imported libraries) and restart the training function from
            the checkpoint. ``"full_group"`` starts a whole new worker group.
            If replacing fails, the controller falls back to a new group.
        standby_worker: with ``"replace_failed"`` and ``max_failures != 0``, keep
            one spare worker process started, with torch imported, that takes
            over a failed rank on its node at once (no actor start, no imports):
            training resumes well under a second after a worker dies. It
            reserves no Ray resources and is used for CPU-only workers; it
            costs one idle process. ``False`` turns it off.
        health_check_timeout_s: a worker that does not answer for this long
            counts as failed (hung).

    Example:
        >>> FailureConfig(max_failures=3).max_failures
        3
    """

    restart_strategy: Literal["replace_failed", "full_group"] = "replace_failed"
    standby_worker: bool = True


class RunConfig(BaseRunConfig):
    """Where a run writes, what it is called, and how it recovers.

    Extends ``lumos.runtime.RunConfig`` with Train's ``FailureConfig`` and
    ``train.Callback`` callbacks. ``RunConfig(storage_path, name)`` identifies a
    run: calling ``fit()`` again with the same pair resumes that run from its
    latest checkpoint.

    Args:
        name: the run's name (its directory under ``storage_path``). Default:
            a readable unique name such as ``train-2026-11-29_17-40-03-a1b2``;
            inside a Tune trial: ``"train"`` (so a resumed trial resumes it).
        storage_path: local directory or fsspec URL (``s3://bucket/runs``).
            Default (``None``): the enclosing Tune trial's directory, else
            ``~/lumos_results``.
        storage_filesystem: an fsspec filesystem to use for ``storage_path``.
        failure_config: see ``FailureConfig``.
        checkpoint_config: see ``CheckpointConfig``.
        callbacks: ``train.Callback`` objects; they run in the driver.
        verbose: print concise state lines to stderr: ``1`` or ``True``
            (default), ``0`` or ``False`` silences them; ``2`` is accepted too.

    Example:
        >>> RunConfig(name="run-42", storage_path="/tmp/runs",
        ...           failure_config=FailureConfig(max_failures=2)).name
        'run-42'
    """

    callback_type: ClassVar[type] = Callback

    failure_config: FailureConfig = Field(default_factory=FailureConfig)
    callbacks: list[Callback] = Field(default_factory=list)
