"""DataParallelTrainer: the user-facing entry point that owns one run."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from lumos.runtime import (
    DefaultFailurePolicy,
    ElasticScalingPolicy,
    GroupFactory,
    ResizePolicy,
    WorkerGroupProtocol,
    WorkerGroupSpec,
    context as job_context,
    ensure_ray,
)
from lumos.storage import Checkpoint, CheckpointConfig, Lease, RetentionPolicy, RunState, RunStorage
from lumos.train._internal.backend import Backend
from lumos.train._internal.config import RunConfig, ScalingConfig
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.controller import TrainController
from lumos.train._internal.controller.spec import ControllerSettings, ControllerSpec, RunSpec
from lumos.train._internal.controller.validations import (
    RayValidationLauncher,
    ThreadValidationLauncher,
    ValidationLauncher,
)
from lumos.train._internal.data_config import DataConfig
from lumos.train._internal.datasets import DatasetBackend, check_data_config, check_datasets
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.result import Result, result_from_state
from lumos.train._internal.run_claim import ClaimedRun, claim_train_run, load_or_create_state
from lumos.train._internal.sigterm import run_stopping_on_sigterm
from lumos.train._internal.validation import ValidationConfig


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


def _check_arguments(
    fn: Any,
    config: Any,
    scaling_config: Any,
    run_config: Any,
    resume_from_checkpoint: Any,
    validation_config: Any,
) -> None:
    """The trainer's arguments have the right types (``TrainConfigError`` otherwise)."""
    if not callable(fn):
        raise TrainConfigError(
            f"train_loop_per_worker={fn!r} is not callable; pass a function fn(config) or fn()"
        )
    if config is not None and not isinstance(config, dict):
        raise TrainConfigError(
            f"train_loop_config={config!r} is a {type(config).__name__}; pass a dict or None"
        )
    if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
        raise TrainConfigError(f"scaling_config={scaling_config!r} is not a train.ScalingConfig")
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise TrainConfigError(f"run_config={run_config!r} is not a train.RunConfig")
    if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, Checkpoint):
        raise TrainConfigError(
            f"resume_from_checkpoint={resume_from_checkpoint!r} is not a train.Checkpoint; "
            "pass train.Checkpoint.from_directory(path) or None"
        )
    if validation_config is not None and not isinstance(validation_config, ValidationConfig):
        raise TrainConfigError(
            f"validation_config={validation_config!r} is not a train.ValidationConfig; "
            "pass train.ValidationConfig(fn) or None"
        )


def _thread_launcher(config: ValidationConfig) -> ValidationLauncher:
    """Validations in threads of the driver (local mode, the fake cluster of unit tests)."""
    return ThreadValidationLauncher(config.fn)


def _ray_launcher(config: ValidationConfig) -> ValidationLauncher:
    """Each validation a Ray task with the config's ``ray_remote_kwargs``."""
    return RayValidationLauncher(config.fn, config.ray_remote_kwargs)


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
        validation_config: ``train.ValidationConfig(fn)``: validates the checkpoints
            of ``train.report(..., validation=True)`` in Ray tasks of their own while
            training goes on (see the package README, "Validation").
        datasets: Ray Datasets by name (needs ``lumos-train[data]``); each rank reads
            its part with ``train.get_dataset_shard(name)`` (README, "Data input").
        dataset_config: which datasets are split across the workers
            (``train.DataConfig``; default: all of them).

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
        validation_config: ValidationConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        _group_factory: GroupFactory | None = None,
        _controller_settings: ControllerSettings | None = None,
    ) -> None:
        _check_arguments(
            train_loop_per_worker,
            train_loop_config,
            scaling_config,
            run_config,
            resume_from_checkpoint,
            validation_config,
        )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.validation_config = validation_config
        self.datasets = check_datasets(datasets)
        self.dataset_config = check_data_config(dataset_config, list(self.datasets))
        if validation_config is not None:
            _check_picklable(validation_config.fn, f"ValidationConfig(fn={validation_config.fn!r})")
        self._pass_config = _takes_config(train_loop_per_worker, train_loop_config is not None)
        if not self.scaling_config.local_mode:  # local mode ships nothing to other processes
            _check_picklable(
                train_loop_per_worker, f"train_loop_per_worker={train_loop_per_worker!r}"
            )
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

    def _starting_checkpoint(self) -> Checkpoint | None:
        """``resume_from_checkpoint``, else the parent Tune trial's (a PBT clone)."""
        if self.resume_from_checkpoint is not None:
            return self.resume_from_checkpoint
        ctx = job_context.current()
        if ctx is None or ctx.starting_checkpoint is None:
            return None
        return Checkpoint(ctx.starting_checkpoint, ctx.storage_filesystem)

    def fit(self) -> Result:
        """Run training to the end and return its result.

        Calling ``fit()`` with the ``RunConfig(storage_path, name)`` of an
        unfinished run resumes it from its latest checkpoint; for a finished
        run it returns the stored result without training again (and says so).
        ``RunConfig(if_exists="error")`` refuses a stored run instead, ``"new"``
        starts a new run beside it (``name-2``, ...).

        With ``ScalingConfig(num_workers=0)`` the function runs in this process
        without Ray (under ``torchrun``: one rank per process); see the package
        README, "Local mode and torchrun".

        Returns:
            The run's ``Result``.

        Raises:
            TrainingFailedError: the run failed beyond ``FailureConfig(max_failures)``.
            lumos.storage.LeaseHeldError: another live driver is running this run.
            TrainConfigError: ``RunConfig(if_exists="error")`` and the run exists.
            KeyboardInterrupt: on Ctrl-C (after stopping the workers); call
                ``fit()`` again to resume.
            SystemExit: on SIGTERM to this process (a job scheduler stopping it):
                the workers stop at their next report, the run state is saved, and
                the process exits with status 143; ``fit()`` with the same
                ``RunConfig`` resumes the run. (Only when ``fit()`` runs in the main
                thread, where Python delivers signals.)
        """
        console = Console(self.run_config.verbose)
        claim = claim_train_run(self.run_config, console, self.scaling_config.local_mode)
        storage, configured = claim.storage, claim.where
        if self.scaling_config.local_mode:
            if claim.lease is not None:
                claim.lease.release()  # the local runner takes it on the rank that writes
            return self._fit_local(claim, console)
        assert claim.lease is not None
        with _renewing(claim.lease):
            state = load_or_create_state(storage, console, claim.fresh)
            _catch_up_parent(storage, state)
            if state.status == "finished":
                console.info(
                    messages.already_finished_line(storage.name, storage.uri, state.updated_at)
                )
                return result_from_state(storage, state, metrics=None)
            if self._group_factory is None:
                ensure_ray()
            spec = self._controller_spec(storage, state, console, configured)
            controller = TrainController(spec)
            self._last_controller = controller
            try:
                return run_stopping_on_sigterm(controller.run)
            finally:
                spec.backend.shutdown()  # drops the dataset shards (Ray Data coordinators)

    def _fit_local(self, claim: ClaimedRun, console: Console) -> Result:
        """``num_workers=0``: run in this process, without Ray (``local.py``)."""
        from lumos.train._internal.local import LocalSpec, run_local
        from lumos.train._internal.local_exchange import has_torchrun_env

        if self.datasets and has_torchrun_env():
            raise TrainConfigError(
                "datasets= under torchrun: every process would run its own copy of the "
                "Ray Data pipeline; run with ScalingConfig(num_workers >= 1) (Ray), or read "
                "the data in the training function"
            )
        spec = LocalSpec(
            run=self._run_spec(claim.storage, console, claim.where, threads=True),
            open_state=partial(load_or_create_state, fresh=claim.fresh),
            process_group_backend=self._backend().process_group_backend(),
            use_gpu=self.scaling_config.use_gpu,
            dataset_shards=self._dataset_shards() if self.datasets else None,
            hang_timeout_s=self.run_config.failure_config.hang_timeout_s,
        )
        return run_local(spec)

    def _dataset_shards(self) -> Callable[[int], list[dict[str, Any]]]:
        """Local mode: the datasets split for a world size (a local Ray runs Ray Data)."""
        datasets, config = self.datasets, self.dataset_config

        def shards(world_size: int) -> list[dict[str, Any]]:
            resolved = {k: v() if callable(v) else v for k, v in datasets.items()}
            return config.configure(resolved, world_size, None, None)

        return shards

    def _run_spec(
        self, storage: RunStorage, console: Console, where: tuple[str, Any], threads: bool
    ) -> RunSpec:
        """What every backend runs the same way (``threads``: validations in threads)."""
        rc = self.run_config
        return RunSpec(
            train_fn=self.train_loop_per_worker,
            config=self.train_loop_config,
            pass_config=self._pass_config,
            storage=storage,
            worker_storage=where,
            retention=_retention(rc.checkpoint_config),
            callbacks=tuple(rc.callbacks),
            job_context=job_context.current(),
            console=console,
            settings=self._settings,
            resume_from_checkpoint=self._starting_checkpoint(),
            validation_config=self.validation_config,
            validation_launcher=_thread_launcher if threads else _ray_launcher,
            health_checks=tuple(rc.health_checks),
            max_rollbacks=rc.failure_config.max_rollbacks,
        )

    def _controller_spec(
        self, storage: RunStorage, state: RunState, console: Console, where: tuple[str, Any]
    ) -> ControllerSpec:
        rc = self.run_config
        sc = self.scaling_config
        fc = rc.failure_config
        backend = self._backend()
        if self.datasets:
            backend = DatasetBackend(backend, self.datasets, self.dataset_config)
        group_spec = WorkerGroupSpec(
            num_workers=sc.max_workers,
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
            runtime_env=rc.worker_runtime_env,
            min_workers=sc.min_workers if sc.elasticity_enabled else None,
        )
        return ControllerSpec(
            # the fake cluster of the unit tests has no Ray: validations run in threads
            run=self._run_spec(storage, console, where, threads=self._group_factory is not None),
            run_state=state,
            group_spec=group_spec,
            group_factory=self._group_factory or _start_ray_group,
            failure_policy=DefaultFailurePolicy(fc.max_failures),
            resize_policy=ResizePolicy(
                elastic=sc.elasticity_enabled, max_preemption_failures=fc.max_preemption_failures
            ),
            backend=backend,
            restart_strategy=fc.restart_strategy,
            scaling_policy=ElasticScalingPolicy() if sc.elasticity_enabled else None,
            resize_interval_s=sc.elastic_resize_monitor_interval_s,
            hang_timeout_s=fc.hang_timeout_s,
            hang_avoid_node=fc.hang_avoid_node,
        )


@contextmanager
def _renewing(lease: Lease) -> Iterator[None]:
    """Renew the claimed run's lease in the background; release it at the end."""
    lease.start_renewing()
    try:
        yield
    finally:
        lease.release()


def _catch_up_parent(storage: RunStorage, state: RunState) -> None:
    """Re-send to the parent Tune trial the reports this run committed after the trial's
    latest checkpoint.

    A Tune retry (the trial's actor died) or a restored sweep resumes the trial from
    the last checkpoint it heard of, while this run resumes from its own latest commit,
    which may be later (the actor died between a commit and its forward). Sending the
    reports in between keeps the trial's history step for step with this run: the
    pruner sees every step once.
    """
    ctx = job_context.current()
    latest = state.latest()
    if ctx is None or ctx.report_checkpoint is None or latest is None:
        return
    uris = {r.report_index: storage.checkpoint(r.dir_name).uri for r in state.checkpoints}
    known = ctx.starting_checkpoint
    if known is None or not known.startswith(storage.uri.rstrip("/") + "/"):
        after = -1  # the trial has nothing of this run: all of it
    else:
        found = [i for i, uri in uris.items() if uri == known]
        if not found:
            return  # retention deleted the trial's checkpoint: where it stands is unknown
        after = found[0]
    rows = storage.read_metrics()
    for index in range(after + 1, min(latest.report_index + 1, len(rows))):
        ctx.forward(rows[index], uris.get(index))


def _retention(cc: CheckpointConfig) -> RetentionPolicy | None:
    """What ``CheckpointConfig`` keeps (``None``: every checkpoint)."""
    return cc.retention() if cc.num_to_keep is not None else None


def _start_ray_group(
    spec: WorkerGroupSpec, on_waiting: Callable[[str], None] | None = None
) -> WorkerGroupProtocol:
    from lumos.runtime import WorkerGroup

    return WorkerGroup.start(spec, on_waiting=on_waiting)
