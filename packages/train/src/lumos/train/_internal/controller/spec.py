"""What a ``TrainController`` runs: one ``ControllerSpec`` (built by ``fit()``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lumos.train._internal.backend import Backend
from lumos.train._internal.console import Console

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lumos.runtime import FailurePolicy, GroupFactory, ScalingPolicy, WorkerGroupSpec
    from lumos.runtime.context import JobContext
    from lumos.storage import Checkpoint, RetentionPolicy, RunState, RunStorage
    from lumos.train._internal.callback import Callback
    from lumos.train._internal.controller.validations import ValidationLauncher
    from lumos.train._internal.health import HealthCheck
    from lumos.train._internal.validation import ValidationConfig

RestartStrategy = Literal["replace_failed", "full_group"]


@dataclass(frozen=True)
class ControllerSettings:
    """Timing knobs of the controller (not user-facing; tests shorten them).

    Attributes:
        poll_interval_s: Longest wait in one poll; bounds how late a stop request or
            a metrics flush is noticed.
        stop_grace_s: How long surviving workers get to end their training thread
            before the controller falls back to a full restart.
        shutdown_grace_s: How long a shut-down worker may take to end.
        metrics_flush_rows: Write the metrics history once this many rows are buffered.
        metrics_flush_interval_s: ... or once the oldest buffered row waited this long.
    """

    poll_interval_s: float = 0.25
    stop_grace_s: float = 15.0
    shutdown_grace_s: float = 2.0
    metrics_flush_rows: int = 200
    metrics_flush_interval_s: float = 2.0


@dataclass(frozen=True)
class ControllerSpec:
    """Everything one run's controller needs.

    Attributes:
        train_fn: The user's per-worker function.
        config: The ``train_loop_config`` passed to it.
        pass_config: Whether ``train_fn`` takes the config argument.
        group_spec: The worker group to start (``num_workers`` from the ScalingConfig).
        storage: The run's storage.
        run_state: Its state when ``fit()`` started (new, or loaded to resume).
        group_factory: Starts a worker group (``WorkerGroup.start`` or a fake's).
        failure_policy: Decides RETRY or RAISE after each failure.
        worker_storage: ``(storage_path, filesystem or None)`` as configured, for the
            workers (no filesystem object is shipped when none was given).
        retention: Which committed checkpoints to keep (``None``: all).
        backend: Framework set-up around the function (the torch process group).
        restart_strategy: ``"replace_failed"`` or ``"full_group"``.
        callbacks: Driver-side callbacks.
        job_context: The enclosing job (a Tune trial), or ``None``.
        console: Where state lines go.
        settings: Timing knobs.
        resume_from_checkpoint: The trainer's starting checkpoint (fine-tuning), used
            until the run commits a checkpoint of its own.
        validation_config: The trainer's ``ValidationConfig``, or ``None``.
        validation_launcher: Starts validation tasks (built from ``validation_config``
            on first use: a Ray task; unit tests pass threads).
        health_checks: ``RunConfig.health_checks``.
        max_rollbacks: ``FailureConfig.max_rollbacks`` (``-1``: unlimited).
        scaling_policy: Decides an elastic group's size (``None``: fixed size).
        resize_interval_s: How often a running elastic group asks ``scaling_policy``.
        max_preemption_failures: Deaths of ranks under a preemption notice the run
            may recover from, apart from ``max_failures`` (``-1``: unlimited).
    """

    train_fn: Callable[..., Any]
    config: dict[str, Any] | None
    pass_config: bool
    group_spec: WorkerGroupSpec
    storage: RunStorage
    run_state: RunState
    group_factory: GroupFactory
    failure_policy: FailurePolicy
    worker_storage: tuple[str, AbstractFileSystem | None]
    retention: RetentionPolicy | None = None
    backend: Backend = field(default_factory=Backend)
    restart_strategy: RestartStrategy = "replace_failed"
    callbacks: tuple[Callback, ...] = ()
    job_context: JobContext | None = None
    console: Console = field(default_factory=lambda: Console(0))
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    resume_from_checkpoint: Checkpoint | None = None
    validation_config: ValidationConfig | None = None
    validation_launcher: Callable[[ValidationConfig], ValidationLauncher] | None = None
    health_checks: tuple[HealthCheck, ...] = ()
    max_rollbacks: int = 3
    scaling_policy: ScalingPolicy | None = None
    resize_interval_s: float = 60.0
    max_preemption_failures: int = -1
