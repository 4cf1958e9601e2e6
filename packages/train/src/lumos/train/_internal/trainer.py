"""DataParallelTrainer: the user-facing entry point that owns one run."""

from __future__ import annotations

import datetime
import inspect
import secrets
from collections.abc import Callable
from typing import Any

from lumos.runtime import FailurePolicy, WorkerGroupSpec
from lumos.runtime import context as job_context
from lumos.storage import RunState, RunStorage
from lumos.train._internal.backend import Backend
from lumos.train._internal.config import DEFAULT_STORAGE_PATH, RunConfig, ScalingConfig
from lumos.train._internal.console import Console
from lumos.train._internal.controller.controller import (
    ControllerSettings,
    GroupFactory,
    TrainController,
)
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
        self._pass_config = _takes_config(train_loop_per_worker, train_loop_config is not None)
        _check_picklable(train_loop_per_worker, f"train_loop_per_worker={train_loop_per_worker!r}")
        if train_loop_config is not None:
            _check_picklable(train_loop_config, "train_loop_config")
        # internal seams: tests inject lumos.runtime.testing.FakeCluster.start here
        self._group_factory: GroupFactory | None = None
        self._last_controller: TrainController | None = None
        self._settings = ControllerSettings()

    def _backend(self) -> Backend:
        return Backend()

    def _env_vars(self) -> dict[str, str]:
        return {}

    def _resolve_storage(self) -> tuple[RunStorage, tuple[str, Any]]:
        rc = self.run_config
        ctx = job_context.current()
        if rc.storage_path is not None:
            path, fs = rc.storage_path, rc.storage_filesystem
        elif ctx is not None:
            path, fs = ctx.storage_path, rc.storage_filesystem or ctx.storage_filesystem
        else:
            path, fs = DEFAULT_STORAGE_PATH, rc.storage_filesystem
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
        rc = self.run_config
        console = Console(rc.verbose)
        storage, configured = self._resolve_storage()
        lease = storage.acquire_lease()
        lease.start_renewing()
        try:
            state = storage.load_state()
            if state is None:
                state = RunState(name=storage.name)
                storage.save_state(state)
                console.info(f"starting run {storage.name!r} in {storage.uri}")
            elif state.status == "finished":
                console.info(
                    f"run {storage.name!r} in {storage.uri} already finished; returning its "
                    "result without training. To train again, pass a new "
                    "RunConfig(name=...) or delete that directory."
                )
                return result_from_state(storage, state, metrics=None)
            else:
                latest = state.latest()
                removed = storage.delete_uncommitted()
                where = f"checkpoint {latest.dir_name!r}" if latest else "the start (no checkpoint)"
                console.info(
                    f"resuming run {storage.name!r} (it was {state.status}) from {where}"
                    + (f"; removed unfinished upload(s) {removed}" if removed else "")
                )
            if self._group_factory is None:
                _ensure_ray()
            controller = self._controller(storage, state, console, configured)
            self._last_controller = controller
            return controller.run()
        finally:
            lease.release()

    def _controller(
        self, storage: RunStorage, state: RunState, console: Console, where: tuple[str, Any]
    ) -> TrainController:
        rc = self.run_config
        sc = self.scaling_config
        fc = rc.failure_config
        cc = rc.checkpoint_config
        backend = self._backend()
        spec = WorkerGroupSpec(
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
        retention = cc.retention() if cc.num_to_keep is not None else None
        return TrainController(
            train_fn=self.train_loop_per_worker,
            config=self.train_loop_config,
            pass_config=self._pass_config,
            spec=spec,
            storage=storage,
            run_state=state,
            failure_policy=FailurePolicy(fc.max_failures),
            retention=retention,
            backend=backend,
            group_factory=self._group_factory or _start_ray_group,
            restart_strategy=fc.restart_strategy,
            callbacks=list(rc.callbacks),
            job_context=job_context.current(),
            console=console,
            settings=self._settings,
            worker_storage=where,
        )


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init()


def _start_ray_group(spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None) -> Any:
    from lumos.runtime import WorkerGroup

    _ensure_ray()
    return WorkerGroup.start(spec, on_waiting=on_waiting)
