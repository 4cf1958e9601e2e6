"""User-facing configuration models (pydantic).

Invalid values fail at construction with a message that names the field, the
value and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lumos.runtime import (
    FailureConfig as BaseFailureConfig,
    PlacementStrategy,
    RunConfig as BaseRunConfig,
    validate_resources,
    validate_runtime_env,
)
from lumos.train._internal.callback import Callback


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class ScalingConfig(_Config):
    """How many workers to run and what each one needs.

    Args:
        num_workers: number of training workers (one Ray actor each). ``0`` runs
            the training function in the calling process, without Ray (local mode:
            step through it in a debugger; under ``torchrun`` each process is one
            rank). A ``(min_workers, max_workers)`` tuple, ``1 <= min <= max``, asks
            for elastic training (``(n, n)`` is the same as ``n``).
        elastic_resize_monitor_interval_s: with elastic ``num_workers``, how often
            (seconds, > 0) to consider resizing the group. Default 60, as in Ray.
        use_gpu: give each worker one GPU (``resources_per_worker["GPU"]``
            defaults to 1) and use NCCL in ``TorchTrainer``.
        resources_per_worker: Ray resources per worker, e.g.
            ``{"CPU": 2, "GPU": 1}``. Default: 1 CPU (plus 1 GPU with
            ``use_gpu``).
        placement_strategy: Ray placement-group strategy for the workers:
            ``"PACK"`` (default), ``"SPREAD"``, ``"STRICT_PACK"`` or
            ``"STRICT_SPREAD"``.
        trainer_resources: not supported: lumos runs the controller in the process
            that calls ``fit()``, not in a trainer actor, so there is nothing to
            reserve resources for. Passing it raises an error that says so.

    Example:
        >>> ScalingConfig(num_workers=4, use_gpu=True).worker_resources()
        {'CPU': 1.0, 'GPU': 1.0}
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: PlacementStrategy = "PACK"
    elastic_resize_monitor_interval_s: float = 60.0
    trainer_resources: None = None

    @field_validator("num_workers", mode="before")
    @classmethod
    def _check_num_workers(cls, value: Any) -> int | tuple[int, int]:
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if is_int(value):
            if value < 0:
                raise ValueError(
                    f"num_workers={value!r} is invalid: use an int >= 1 (Ray workers), 0 "
                    "(local mode: run in this process) or a (min, max) tuple for elastic training"
                )
            return int(value)
        if isinstance(value, tuple | list) and len(value) == 2 and all(map(is_int, value)):
            low, high = int(value[0]), int(value[1])
            if not 1 <= low <= high:
                raise ValueError(
                    f"num_workers={tuple(value)!r} is invalid: an elastic (min_workers, "
                    "max_workers) needs 1 <= min_workers <= max_workers (got "
                    f"min_workers={low}, max_workers={high}); use num_workers=0 for local mode"
                )
            return (low, high)
        raise ValueError(
            f"num_workers={value!r} is invalid: must be an int >= 0 or a (min_workers, "
            "max_workers) tuple of two ints"
        )

    @field_validator("elastic_resize_monitor_interval_s", mode="before")
    @classmethod
    def _check_interval(cls, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(
                f"elastic_resize_monitor_interval_s={value!r} is invalid: must be a "
                "number of seconds > 0 (default 60)"
            )
        return float(value)

    @field_validator("trainer_resources", mode="before")
    @classmethod
    def _refuse_trainer_resources(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                f"trainer_resources={value!r} is not supported: lumos runs the training "
                "controller in the process that calls fit() (the driver), not in a Ray "
                "trainer actor, so there is nothing to reserve; remove trainer_resources "
                "and use resources_per_worker for the workers"
            )
        return None

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

    @property
    def min_workers(self) -> int:
        """The smallest group size: ``num_workers``, or the tuple's first value."""
        n = self.num_workers
        return n if isinstance(n, int) else n[0]

    @property
    def max_workers(self) -> int:
        """The largest group size: ``num_workers``, or the tuple's second value."""
        n = self.num_workers
        return n if isinstance(n, int) else n[1]

    @property
    def elasticity_enabled(self) -> bool:
        """True when ``num_workers`` is a ``(min, max)`` tuple with ``min < max``."""
        return self.min_workers < self.max_workers

    @property
    def local_mode(self) -> bool:
        """True for ``num_workers=0``: the function runs in the calling process."""
        return self.num_workers == 0

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
        max_rollbacks: how many times ``RunConfig(health_checks=...)`` may roll the
            run back to an earlier checkpoint in one ``fit()`` (default 3; ``-1``:
            unlimited; ``0``: a firing check fails the run). Separate from
            ``max_failures``: a rollback is not a failure.
        max_preemption_failures: how many times ranks under a preemption notice (a
            draining node, a SIGTERM to a worker) may be lost before they could move
            (``-1``, default: unlimited, as in Ray). Separate from ``max_failures``: a
            preemption is not a failure; a rank that moves in time uses neither.
        hang_timeout_s: the hang watchdog: a rank whose training thread makes no
            progress (no ``train.report()``, its Python stack unchanged) for this
            long, counted once every rank is inside the training function, fails the
            attempt like any other failure (on Ray the stuck ranks' processes are
            replaced; in local mode and under torchrun the process exits with status
            75 after the run is marked failed); the culprit is named and every rank's
            stacks are written under the run's ``_lumos/hangs/`` (see the README's
            "Hangs"). Default 600 s: Ray's worker health-check timeout
            (``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``) and the time its NCCL hang
            detector takes to confirm a hang; long enough for a slow first step
            (compilation, cuDNN autotuning) and a rank's long stretch of C code, and
            far below gloo's 30-minute collective timeout. Waits in ``train.report``
            (checkpoint uploads, validations), ``torch.save`` and imports never count.
            ``None`` turns the watchdog off.
        hang_avoid_node: after the watchdog fired, start the restarted group on other
            nodes than the culprits' (where the cluster has another alive node; a
            fixed-size group). Default ``False``: a stuck rank is rarely the node's fault.

    Example:
        >>> FailureConfig(max_failures=3).max_failures
        3
    """

    restart_strategy: Literal["replace_failed", "full_group"] = "replace_failed"
    standby_worker: bool = True
    max_rollbacks: int = 3
    max_preemption_failures: int = -1
    hang_timeout_s: float | None = 600.0
    hang_avoid_node: bool = False

    @field_validator("hang_timeout_s", mode="before")
    @classmethod
    def _check_hang_timeout(cls, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(
                f"hang_timeout_s={value!r} is invalid: use a number of seconds > 0, "
                "or None to turn the hang watchdog off"
            )
        return float(value)

    @field_validator("max_rollbacks", "max_preemption_failures", mode="before")
    @classmethod
    def _check_budget(cls, value: Any, info: ValidationInfo) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            zero = {
                "max_rollbacks": "a firing health check fails the run",
                "max_preemption_failures": "a preempted rank lost before it moved fails the run",
            }[str(info.field_name)]
            raise ValueError(
                f"{info.field_name}={value!r} is invalid: use -1 (unlimited), 0 ({zero}) "
                "or a positive number"
            )
        return value


class RunConfig(BaseRunConfig):
    """Where a run writes, what it is called, and how it recovers.

    Extends ``lumos.runtime.RunConfig`` with Train's ``FailureConfig`` and
    ``train.Callback`` callbacks. ``RunConfig(storage_path, name)`` identifies a
    run: calling ``fit()`` again with the same pair resumes that run from its
    latest checkpoint.

    Args:
        name: the run's name (its directory under ``storage_path``). Default:
            a readable unique name such as ``train-2026-11-29_17-40-03-a1b2c3``
            (UTC time; a new one each ``fit()``, even two in the same second);
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
        if_exists: when ``name`` already holds a run: ``"resume"`` (default, as
            Ray Train) resumes it (a finished run returns its stored result and
            says so); ``"error"`` refuses; ``"new"`` starts a new run beside it
            (``name-2``, ``name-3``, ...).
        worker_runtime_env: Ray ``runtime_env`` dict of the training worker actors
            (and their standby): ``env_vars``, ``working_dir``, ``pip`` (where the
            cluster can install packages), ``py_modules``, ... (Ray's keys; an
            unknown key is an error). Default ``None``: the driver's job environment.
            Ignored in local mode (``num_workers=0``), which runs in this process.
        health_checks: checks run in the driver on each of rank 0's reports and on
            each validation result: ``train.NonFiniteMetric("loss")``,
            ``train.MetricSpike("loss", factor=3, window=10)`` or any
            ``fn(report, history) -> train.Rollback | None``. One that returns a
            ``Rollback`` rolls training back to an earlier checkpoint (see the README's
            health section); ``FailureConfig(max_rollbacks)`` bounds how often.

    Example:
        >>> RunConfig(name="run-42", storage_path="/tmp/runs",
        ...           failure_config=FailureConfig(max_failures=2)).name
        'run-42'
    """

    callback_type: ClassVar[type] = Callback

    failure_config: FailureConfig = Field(default_factory=FailureConfig)
    callbacks: list[Callback] = Field(default_factory=list)
    worker_runtime_env: dict[str, Any] | None = None
    health_checks: list[Any] = Field(default_factory=list)

    @field_validator("health_checks", mode="before")
    @classmethod
    def _check_health_checks(cls, value: Any) -> list[Any]:
        from lumos.train._internal.health import validate_health_checks

        return validate_health_checks(value)

    @field_validator("worker_runtime_env", mode="before")
    @classmethod
    def _check_runtime_env(cls, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        return validate_runtime_env(value, "worker_runtime_env")
