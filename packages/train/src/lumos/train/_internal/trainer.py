"""DataParallelTrainer: the user-facing entry point that owns one run."""

from __future__ import annotations

import datetime
import inspect
import secrets
from collections.abc import Callable
from typing import Any

from lumos.runtime import (
    DefaultFailurePolicy,
    GroupFactory,
    WorkerGroupProtocol,
    WorkerGroupSpec,
    context as job_context,
    ensure_ray,
)
from lumos.storage import Checkpoint, RunState, RunStorage
from lumos.train._internal.backend import Backend
from lumos.train._internal.config import RunConfig, ScalingConfig
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.controller import TrainController
from lumos.train._internal.controller.spec import ControllerSettings, ControllerSpec
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.result import Result, result_from_state


def _default_run_name() -> str:
    now = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    return f"train-{now}-{secrets.token_hex(2)}"


def _takes_config(fn: Callable[..., Any], has_config: bool) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: pass the config
        return True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    required = [p for p in positional if p.default is p.empty and p.kind != p.VAR_POSITIONAL]
    if len(required) > 1:
        raise TrainConfigError(
            f"train_loop_per_worker={fn!r} requires {len(required)} arguments "
            f"({', '.join(p.name for p in required)}); it must take no argument or one "
            "(the train_loop_config dict)"
        )
    if not positional:
        if has_config:
            raise TrainConfigError(
                f"train_loop_config was given but train_loop_per_worker={fn!r} takes no "
                "argument; add a `config` parameter or drop train_loop_config"
            )
        return False
    return True


def _check_picklable(value: Any, what: str) -> None:
    from ray import cloudpickle

    dumps: Callable[[Any], bytes] = cloudpickle.dumps
    try:
        dumps(value)
    except Exception as exc:
        raise TrainConfigError(
            f"{what} cannot be pickled, so it cannot be sent to the workers: "
            f"{type(exc).__name__}: {exc}. Define it at module level and do not capture "
            "locks, open files, sockets or Ray/remote handles in it."
        ) from exc


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``num_workers`` Ray workers, fault tolerantly.

    The controller runs in the process that calls ``fit()``; each worker runs
    the function in its own thread. Reports, checkpoints, restarts and
    job-level restore work as described in the package README.
    ``TorchTrainer`` adds a ``torch.distributed`` process group.

    Args:
        train_loop_per_worker: ``fn(config)`` or ``fn()``, run on every worker.
        train_loop_config: the ``config`` dict passed to it.
        scaling_config: how many workers, GPUs, resources.
        run_config: name, storage, failure and checkpoint settings, callbacks.
        resume_from_checkpoint: a checkpoint to start from (e.g. fine-tuning a
            pretrained model): ``train.get_checkpoint()`` returns it on an attempt of
            a run that has no committed checkpoint of its own; once the run committed
            one, restarts and job-level restore use the run's latest instead.

    Raises:
        TrainConfigError: an argument is invalid (e.g. the function does not
            pickle, or takes more than one argument).

    Example:
        >>> def fn(config):
        ...     train.report({"x": config["x"]})
        >>> DataParallelTrainer(fn, train_loop_config={"x": 1}).fit().metrics  # doctest: +SKIP
        {'x': 1}
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        _group_factory: GroupFactory | None = None,
        _controller_settings: ControllerSettings | None = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TrainConfigError(
                f"train_loop_per_worker={train_loop_per_worker!r} is not callable; pass a "
                "function fn(config) or fn()"
            )
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TrainConfigError(
                f"train_loop_config={train_loop_config!r} is a "
                f"{type(train_loop_config).__name__}; pass a dict or None"
            )
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise TrainConfigError(
                f"scaling_config={scaling_config!r} is not a train.ScalingConfig"
            )
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TrainConfigError(f"run_config={run_config!r} is not a train.RunConfig")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        if resume_from_checkpoint is not None and not isinstance(
            resume_from_checkpoint, Checkpoint
        ):
            raise TrainConfigError(
                f"resume_from_checkpoint={resume_from_checkpoint!r} is not a train.Checkpoint; "
                "pass train.Checkpoint.from_directory(path) or None"
            )
        self.resume_from_checkpoint = resume_from_checkpoint
        self._pass_config = _takes_config(train_loop_per_worker, train_loop_config is not None)
        _check_picklable(train_loop_per_worker, f"train_loop_per_worker={train_loop_per_worker!r}")
        if train_loop_config is not None:
            _check_picklable(train_loop_config, "train_loop_config")
        # test seams (not documented): lumos.runtime.testing.FakeCluster.start, timings
        self._group_factory = _group_factory
        self._settings = _controller_settings or ControllerSettings()
        # the controller of the latest fit(), whose state history tests check
        self._last_controller: TrainController | None = None

    def _backend(self) -> Backend:
        return Backend()

    def _env_vars(self) -> dict[str, str]:
        return {}

    def _resolve_storage(self) -> tuple[RunStorage, tuple[str, Any]]:
        rc = self.run_config
        ctx = job_context.current()
        parent = (ctx.storage_path, ctx.storage_filesystem) if ctx is not None else (None, None)
        path, fs = rc.storage_location(*parent)
        name = rc.name or ("train" if ctx is not None else _default_run_name())
        return RunStorage(path, name, fs), (path, fs)

    def fit(self) -> Result:
        """Run training to the end and return its result.

        Calling ``fit()`` with the ``RunConfig(storage_path, name)`` of an
        unfinished run resumes it from its latest checkpoint; for a finished
        run it returns the stored result without training again.

        Returns:
            The run's ``Result``.

        Raises:
            TrainingFailedError: the run failed beyond ``FailureConfig(max_failures)``.
            lumos.storage.LeaseHeldError: another live driver is running this run.
            KeyboardInterrupt: on Ctrl-C (after stopping the workers); call
                ``fit()`` again to resume.
        """
        console = Console(self.run_config.verbose)
        storage, configured = self._resolve_storage()
        with storage.leased():
            state = _load_or_create_state(storage, console)
            if state.status == "finished":
                console.info(messages.already_finished_line(storage.name, storage.uri))
                return result_from_state(storage, state, metrics=None)
            if self._group_factory is None:
                ensure_ray()
            controller = TrainController(self._controller_spec(storage, state, console, configured))
            self._last_controller = controller
            return controller.run()

    def _controller_spec(
        self, storage: RunStorage, state: RunState, console: Console, where: tuple[str, Any]
    ) -> ControllerSpec:
        rc = self.run_config
        sc = self.scaling_config
        fc = rc.failure_config
        cc = rc.checkpoint_config
        backend = self._backend()
        group_spec = WorkerGroupSpec(
            num_workers=sc.num_workers,
            resources_per_worker=sc.worker_resources(),
            placement_strategy=sc.placement_strategy,
            env_vars=self._env_vars(),
            health_check_timeout_s=fc.health_check_timeout_s,
            standby=(
                fc.standby_worker
                and fc.max_failures != 0
                and fc.restart_strategy == "replace_failed"
            ),
            warm_imports=backend.warm_imports,
        )
        return ControllerSpec(
            train_fn=self.train_loop_per_worker,
            config=self.train_loop_config,
            pass_config=self._pass_config,
            group_spec=group_spec,
            storage=storage,
            run_state=state,
            group_factory=self._group_factory or _start_ray_group,
            failure_policy=DefaultFailurePolicy(fc.max_failures),
            worker_storage=where,
            retention=cc.retention() if cc.num_to_keep is not None else None,
            backend=backend,
            restart_strategy=fc.restart_strategy,
            callbacks=tuple(rc.callbacks),
            job_context=job_context.current(),
            console=console,
            settings=self._settings,
            resume_from_checkpoint=self.resume_from_checkpoint,
        )


def _load_or_create_state(storage: RunStorage, console: Console) -> RunState:
    """The run's stored state (cleaned up to resume it), or a new one."""
    state = storage.load_state()
    if state is None:
        state = RunState(name=storage.name)
        storage.save_state(state)
        console.info(messages.starting_line(storage.name, storage.uri))
    elif state.status != "finished":
        removed = storage.delete_uncommitted()
        console.info(messages.resuming_line(storage.name, state.status, state.latest(), removed))
    return state


def _start_ray_group(
    spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
) -> WorkerGroupProtocol:
    from lumos.runtime import WorkerGroup

    return WorkerGroup.start(spec, on_waiting=on_waiting)
