"""Tuner: the entry point that wires storage, the study, the pool and the controller."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from fsspec import AbstractFileSystem

from lumos.runtime import PoolFactory, WorkerPoolProtocol, ensure_ray
from lumos.storage import RunStorage
from lumos.tune._internal import messages
from lumos.tune._internal.callbacks import Callback, setup_callbacks
from lumos.tune._internal.config import RunConfig, TuneConfig
from lumos.tune._internal.controller import ControllerSettings, TuneController
from lumos.tune._internal.errors import TuneConfigError, TuneError, TuneTypeError
from lumos.tune._internal.executor import PoolExecutor
from lumos.tune._internal.experiment import Experiment, open_experiment, quiet_optuna
from lumos.tune._internal.experiment_claim import (
    HOLDER,
    claim_experiment,
    default_name,
    describe_sweep,
    experiment_exists,
    stored_if_finished,
    trainable_name,
)
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.progress import ConsoleReporter
from lumos.tune._internal.ray_compat import combine_stops
from lumos.tune._internal.result import ResultGrid
from lumos.tune._internal.search_space import ParamSpace, SearchSpace
from lumos.tune._internal.session import TrialRunner
from lumos.tune._internal.trainable import as_function
from lumos.tune._internal.trial_rules import StopRules
from lumos.tune._internal.trial_spec import SweepInfo
from lumos.tune._internal.trial_views import snapshots
from lumos.tune._internal.tuner_state import (
    has_definition,
    load_tuner_state,
    save_definition,
    save_tuner_state,
    split_experiment_path,
)
from lumos.tune._internal.wrappers import unwrap_resources, unwrap_resources_fn

logger = logging.getLogger("lumos.tune")


def _with_run_config_stop(tune_config: TuneConfig, run_config: RunConfig) -> TuneConfig:
    stop = run_config.stop
    if run_config.failure_config.fail_fast and not tune_config.fail_fast:
        tune_config = tune_config.model_copy(
            update={"fail_fast": run_config.failure_config.fail_fast}
        )
    if stop is None:
        return tune_config
    stop = combine_stops(tune_config.stop, stop)  # both apply, as in Ray
    fields = {name: getattr(tune_config, name) for name in tune_config.model_fields_set}
    return TuneConfig(**{**fields, "stop": stop})


def _with_trainable_resources(tune_config: TuneConfig, trainable: Any) -> TuneConfig:
    resources = unwrap_resources(trainable)
    if resources is None:
        return tune_config
    if (
        "trial_resources" in tune_config.model_fields_set
        and tune_config.trial_resources != resources
    ):
        raise TuneConfigError(
            f"tune.with_resources(..., {resources}) and TuneConfig(trial_resources="
            f"{tune_config.trial_resources}) disagree; give the resources once"
        )
    return tune_config.model_copy(update={"trial_resources": resources})


class Tuner:
    """Searches hyperparameters: runs ``trainable`` for configs drawn from ``param_space``.

    Args:
        trainable: The trial function ``(config) -> None | dict``; it calls
            ``tune.report(...)`` for intermediate results (a returned dict is a last report).
        param_space: Dict of domains (``tune.uniform``...), grid searches, Optuna
            distributions and constants (nested dicts allowed), or a define-by-run
            function ``(optuna.Trial) -> dict``.
        tune_config: Metric, mode, sampler, pruner, number of trials, concurrency.
        run_config: Name, storage, retries, checkpoints, callbacks, verbosity.

    Raises:
        SearchSpaceError: ``param_space`` is invalid.
        TuneTypeError: ``trainable`` is not callable (also a ``TypeError``).

    Example:
        >>> def objective(config):
        ...     for step in range(10):
        ...         tune.report({"loss": (config["x"] - 2) ** 2 / (step + 1)})
        >>> grid = tune.Tuner(
        ...     objective,
        ...     param_space={"x": tune.uniform(-10, 10)},
        ...     tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=20),
        ... ).fit()
        >>> grid.get_best_result().config
    """

    def __init__(
        self,
        trainable: Callable[[dict[str, Any]], Any],
        *,
        param_space: ParamSpace = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | None = None,
        _pool_factory: PoolFactory | None = None,
    ) -> None:
        if not callable(trainable):
            raise TuneTypeError(
                f"trainable must be a function (config) -> None | dict, got "
                f"{type(trainable).__name__}"
            )
        self.trainable = as_function(trainable)
        if param_space is None and tune_config is not None:
            search = getattr(tune_config.search_alg, "searcher", tune_config.search_alg)
            param_space = getattr(search, "space", None)  # OptunaSearch(space=...)
        self.param_space = param_space
        self.space = SearchSpace(param_space)
        self.tune_config = _with_trainable_resources(tune_config or TuneConfig(), trainable)
        if self.tune_config.scheduler is not None:
            self.tune_config.scheduler.check_space(self.space)
        self.run_config = run_config or RunConfig()
        self.tune_config = _with_run_config_stop(self.tune_config, self.run_config)
        self._pool_factory = _pool_factory
        self._name = self.run_config.name or default_name(trainable)
        # A generated name is new until a fit() claims it; Tuner.restore resumes as is.
        self._generated = None if self.run_config.name else partial(default_name, trainable)
        self._check_stored = True
        self._results: ResultGrid | None = None

    @property
    def experiment_name(self) -> str:
        """The experiment's name (``RunConfig.name``, the default, or e.g. ``name-2``)."""
        return self._name

    def _max_concurrent(self, target: int) -> int:
        configured = self.tune_config.max_concurrent_trials
        if configured is not None:
            limit = configured
        elif self._pool_factory is not None:
            limit = 1
        else:
            import ray

            ensure_ray()
            cpus = float(ray.cluster_resources().get("CPU", 1.0))  # type: ignore[no-untyped-call]
            per_trial = float(self.tune_config.trial_resources.get("CPU", 0.0))
            limit = int(cpus // per_trial) if per_trial > 0 else int(cpus)
        limit = max(1, limit)
        return limit if target == -1 else max(1, min(limit, target))

    def _available_resources(self) -> Callable[[], dict[str, float]] | None:
        if self._pool_factory is not None:
            return None
        import ray

        def available() -> dict[str, float]:
            return dict(ray.available_resources())  # type: ignore[no-untyped-call]

        return available

    def _make_pool(self, resources: dict[str, float]) -> WorkerPoolProtocol:
        if self._pool_factory is not None:
            return self._pool_factory(resources)
        from lumos.runtime import WorkerPool

        timeout = self.tune_config.effective_health_check_timeout_s(self.run_config.failure_config)
        return WorkerPool(resources, health_check_timeout_s=timeout)

    def _run_storage(self) -> RunStorage:
        path, fs = self.run_config.storage_location()
        return RunStorage(path, self._name, fs)

    def fit(self) -> ResultGrid:
        """Run the sweep (or resume it) and return every trial's result.

        Re-running with the same ``RunConfig(storage_path, name)`` resumes the same sweep
        (trainable, metric, mode, search space, sampler): finished trials are kept,
        unfinished ones resume from their last checkpoint. Another sweep under that
        name is kept and this one runs beside it (``name-2``); see ``RunConfig.if_exists``.

        Returns:
            A :class:`ResultGrid`.

        Raises:
            TuneFailedError: A trial failed and ``fail_fast="raise"``.
            MetricNotReportedError: A trial finished without reporting the metric.
            LeaseHeldError: Another live driver runs this experiment.
            TuneConfigError: ``RunConfig(if_exists="error")`` and the experiment exists.
        """
        current = describe_sweep(trainable_name(self.trainable), self.space, self.tune_config)
        claim = claim_experiment(
            self.run_config, self._name, current if self._check_stored else None, self._generated
        )
        storage = claim.storage
        self._name, self._generated = storage.name, None  # a later fit() resumes it
        claim.lease.start_renewing()
        try:
            stored = None if claim.fresh else stored_if_finished(storage, self)
            if stored is None:
                save_tuner_state(storage, self.param_space, self.tune_config)
                if claim.fresh or not has_definition(storage):
                    save_definition(storage, current)
                stored = _Sweep(self, storage).run()
        finally:
            claim.lease.release()
        self._results = self._grid(stored, storage)
        return self._results

    def get_results(self) -> ResultGrid:
        """The results of the experiment: those of the last :meth:`fit`, else the stored ones.

        Raises:
            TuneError: The experiment does not exist yet.

        Example:
            >>> tuner = tune.Tuner.restore("~/lumos_results/sweep-7", objective)
            >>> tuner.get_results().get_best_result()
        """
        if self._results is not None:
            return self._results
        storage = self._run_storage()
        if not experiment_exists(storage):
            raise TuneError(
                f"no experiment at {storage.uri!r} yet: call fit() first, or restore one "
                "with Tuner.restore(path, trainable)"
            )
        with storage.leased(holder=HOLDER), quiet_optuna():
            exp = open_experiment(storage, self.space, self.tune_config)
            try:
                return self._grid(list(exp.trials), storage)
            finally:
                exp.close()

    @classmethod
    def restore(
        cls,
        path: str,
        trainable: Callable[..., Any],
        *,
        param_space: ParamSpace = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | None = None,
        storage_filesystem: AbstractFileSystem | None = None,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
    ) -> Tuner:
        """The Tuner of the experiment at ``path`` (``{storage_path}/{name}``), as Ray's.

        The same as a new ``Tuner`` with ``RunConfig(storage_path, name)`` pointing at
        the experiment: ``fit()`` keeps finished trials and resumes unfinished ones
        from their checkpoints. ``param_space`` and ``tune_config`` default to those
        the experiment was run with (stored by ``fit()``).

        Raises:
            TuneError: There is no experiment at ``path``.
            TuneConfigError: ``resume_errored`` / ``restart_errored`` (not supported:
                errored trials stay as they ended) or ``resume_unfinished=False``.

        Example:
            >>> if tune.Tuner.can_restore("~/lumos_results/sweep-7"):
            ...     tuner = tune.Tuner.restore("~/lumos_results/sweep-7", objective)
            ...     grid = tuner.fit()
        """
        if resume_errored or restart_errored or not resume_unfinished:
            raise TuneConfigError(
                "Tuner.restore(resume_unfinished=True) is the only mode: errored trials stay "
                "as they ended and unfinished ones resume; drop resume_errored / "
                "restart_errored / resume_unfinished"
            )
        storage_path, name = split_experiment_path(path)
        storage = RunStorage(storage_path, name, storage_filesystem)
        if not experiment_exists(storage):
            raise TuneError(f"Tuner.restore({path!r}): no experiment there")
        saved = load_tuner_state(storage)
        if param_space is None:
            param_space = saved.get("param_space")
        if tune_config is None:
            tune_config = saved.get("tune_config")
        updates: dict[str, Any] = {
            "name": name,
            "storage_path": storage_path,
            "if_exists": "resume",
        }
        if storage_filesystem is not None:
            updates["storage_filesystem"] = storage_filesystem
        run_config = (run_config or RunConfig()).model_copy(update=updates)
        tuner = cls(
            trainable, param_space=param_space, tune_config=tune_config, run_config=run_config
        )
        tuner._check_stored = False  # the experiment at path, whatever it holds
        return tuner

    def _grid(self, trials: list[LiveTrial], storage: RunStorage) -> ResultGrid:
        # The sweep is over: its study, journals and controller (which reference each
        # other) go first, so that the grid does not add to the driver's peak memory.
        gc.collect()
        ordered = sorted(trials, key=lambda t: t.number)
        return ResultGrid._of_finished_sweep(
            ordered, storage.fs, self.tune_config.metric, self.tune_config.mode, storage.uri
        )

    @classmethod
    def can_restore(
        cls,
        path: str,
        name: str | None = None,
        storage_filesystem: AbstractFileSystem | None = None,
    ) -> bool:
        """Whether an experiment exists at ``path`` (``{storage_path}/{name}``, as Ray's),
        or at ``{path}/{name}`` when ``name`` is given.

        Example:
            >>> tune.Tuner.can_restore("~/lumos_results/sweep-7")
        """
        if name is None:
            path, name = split_experiment_path(path)
        storage = RunStorage(path, name, storage_filesystem)
        return experiment_exists(storage)


class _Sweep:
    """One ``Tuner.fit()`` under the experiment's lease: set up, run, always clean up."""

    def __init__(self, tuner: Tuner, storage: RunStorage) -> None:
        self.tuner = tuner
        self.storage = storage
        self.callbacks: list[Callback] = tuner.run_config.callback_objects()
        self.executor: PoolExecutor | None = None
        self.reporter: ConsoleReporter | None = None
        self.exp: Experiment | None = None
        self.controller: TuneController | None = None

    def run(self) -> list[LiveTrial]:
        status = "aborted"
        try:
            with quiet_optuna():
                trials = self._controller().run()
            status = "finished"
        except TuneError:
            status = "errored"
            raise
        finally:
            self._close(status)
        return trials

    def _controller(self) -> TuneController:
        tuner, storage = self.tuner, self.storage
        tc, rc = tuner.tune_config, tuner.run_config
        self.exp = exp = open_experiment(storage, tuner.space, tc)
        target = -1 if tc.num_samples == -1 else tc.num_samples * tuner.space.num_grid_points
        resources = {k: float(v) for k, v in tc.trial_resources.items()}
        pool = tuner._make_pool(resources)
        pbt = tc.scheduler
        sweep = SweepInfo(
            experiment=storage,
            retention=rc.checkpoint_config.retention(),
            metric=tc.metrics[0] if len(tc.metrics) == 1 else None,
            resources=resources,
            stop=dict(tc.stop) if isinstance(tc.stop, dict) else None,
            judge_reports=StopRules(tc).judges_reports,
            checkpoint_frequency=getattr(rc.checkpoint_config, "checkpoint_frequency", 0),
            checkpoint_at_end=getattr(rc.checkpoint_config, "checkpoint_at_end", None),
            pbt_look=(
                (pbt.time_attr, pbt.perturbation_interval, pbt.burn_in_period)
                if pbt is not None
                else None
            ),
        )
        self.executor = PoolExecutor(
            pool,
            TrialRunner(tuner.trainable, sweep),
            available_resources=tuner._available_resources(),
            resources=resources,
            resources_fn=unwrap_resources_fn(tuner.trainable),
        )
        if rc.verbose > 0:
            self.reporter = self._reporter(exp)
        setup_callbacks(
            self.callbacks,
            storage.uri,
            storage.fs,
            stop=tc.stop,
            num_samples=tc.num_samples,
            total_num_samples=target,
        )
        self.controller = TuneController(
            exp,
            tuner.space,
            tc,
            self.executor,
            ControllerSettings(
                max_concurrent_trials=tuner._max_concurrent(target),
                max_failures=rc.failure_config.max_failures,
                retention=sweep.retention,
            ),
            callbacks=self.callbacks,
            progress=self.reporter,
            resources=resources,
            trainable_name=trainable_name(tuner.trainable),
        )
        return self.controller

    def _reporter(self, exp: Experiment) -> ConsoleReporter:
        tc, rc = self.tuner.tune_config, self.tuner.run_config
        reporter = ConsoleReporter(tc.metrics, verbose=rc.verbose)
        reporter.set_mode(tc.modes[0] if tc.modes else None)
        if exp.resumed:
            done = sum(1 for t in exp.trials if t.status.is_finished)
            reporter.console.print(
                messages.resuming(self.storage.uri, done, len(exp.trials) - done),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return reporter

    def _close(self, status: str) -> None:
        if self.executor is not None:
            self.executor.shutdown(grace_period_s=0.0 if status != "finished" else 5.0)
        if self.exp is not None:
            self.exp.close()
            try:
                state = self.storage.load_state()
                if state is not None:
                    self.storage.save_state(state.model_copy(update={"status": status}))
            except Exception:
                logger.warning(messages.STATUS_NOT_RECORDED, exc_info=True)
        all_trials = self.controller.trials if self.controller is not None else []
        if self.callbacks:
            frozen = snapshots(all_trials)
            for cb in self.callbacks:
                cb.on_experiment_end(frozen)
        if self.reporter is not None:
            self.reporter.close(all_trials)
