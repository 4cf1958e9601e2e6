"""What one ``fit()`` runs: a :class:`RunSpec` (every backend) plus a backend's own part.

``DataParallelTrainer.fit`` builds one ``RunSpec`` for the run core (``core.py``) and
wraps it in the backend's spec: :class:`ControllerSpec` for the Ray controller, or
``local.LocalSpec`` for local mode and torchrun.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lumos.train._internal.backend import Backend
from lumos.train._internal.console import Console

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lumos.runtime import (
        FailurePolicy,
        GroupFactory,
        ResizePolicy,
        ScalingPolicy,
        WorkerGroupSpec,
    )
    from lumos.runtime.context import JobContext
    from lumos.storage import Checkpoint, RetentionPolicy, RunState, RunStorage
    from lumos.train._internal.callback import Callback
    from lumos.train._internal.controller.validations import ValidationLauncher
    from lumos.train._internal.health import HealthCheck
    from lumos.train._internal.validation import ValidationConfig

RestartStrategy = Literal["replace_failed", "full_group"]


@dataclass(frozen=True)
class ControllerSettings:
    """Timing knobs of the driver (not user-facing; tests shorten them).

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
class RunSpec:
    """What every backend runs the same way: the function, the storage, the checks.

    Attributes:
        train_fn: The user's per-rank function.
        config: The ``train_loop_config`` passed to it.
        pass_config: Whether ``train_fn`` takes the config argument.
        storage: The run's storage.
        worker_storage: ``(storage_path, filesystem or None)`` as configured, for the
            ranks (no filesystem object is shipped when none was given).
        retention: Which committed checkpoints to keep (``None``: all).
        callbacks: Driver-side callbacks.
        job_context: The enclosing job (a Tune trial), or ``None``.
        console: Where state lines go.
        settings: Timing knobs.
        resume_from_checkpoint: The trainer's starting checkpoint (fine-tuning), used
            until the run commits a checkpoint of its own.
        validation_config: The trainer's ``ValidationConfig``, or ``None``.
        validation_launcher: Starts validation tasks, built from ``validation_config``
            on first use (a Ray task; threads in local mode and unit tests).
        health_checks: ``RunConfig.health_checks``.
        max_rollbacks: ``FailureConfig.max_rollbacks`` (``-1``: unlimited).
    """

    train_fn: Callable[..., Any]
    config: dict[str, Any] | None
    pass_config: bool
    storage: RunStorage
    worker_storage: tuple[str, AbstractFileSystem | None]
    retention: RetentionPolicy | None = None
    callbacks: tuple[Callback, ...] = ()
    job_context: JobContext | None = None
    console: Console = field(default_factory=lambda: Console(0))
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    resume_from_checkpoint: Checkpoint | None = None
    validation_config: ValidationConfig | None = None
    validation_launcher: Callable[[ValidationConfig], ValidationLauncher] | None = None
    health_checks: tuple[HealthCheck, ...] = ()
    max_rollbacks: int = 3


@dataclass(frozen=True)
class ControllerSpec:
    """The Ray controller's part: the worker group and its policies.

    Attributes:
        run: What every backend shares.
        run_state: The run's state when ``fit()`` started (new, or loaded to resume).
        group_spec: The worker group to start.
        group_factory: Starts a worker group (``WorkerGroup.start`` or a fake's).
        failure_policy: Decides RETRY or RAISE after each failure.
        resize_policy: When the group moves or grows, and the preemption budget.
        backend: Framework set-up around the function (the torch process group).
        restart_strategy: ``"replace_failed"`` or ``"full_group"``.
        scaling_policy: Decides an elastic group's size (``None``: fixed size).
        resize_interval_s: How often a running elastic group asks ``scaling_policy``.
        hang_timeout_s: ``FailureConfig(hang_timeout_s)``: the hang watchdog's timeout
            (``None``: no watchdog).
        hang_avoid_node: ``FailureConfig(hang_avoid_node)``: restart off the culprits' nodes.
    """

    run: RunSpec
    run_state: RunState
    group_spec: WorkerGroupSpec
    group_factory: GroupFactory
    failure_policy: FailurePolicy
    resize_policy: ResizePolicy
    backend: Backend = field(default_factory=Backend)
    restart_strategy: RestartStrategy = "replace_failed"
    scaling_policy: ScalingPolicy | None = None
    resize_interval_s: float = 60.0
    hang_timeout_s: float | None = None
    hang_avoid_node: bool = False
