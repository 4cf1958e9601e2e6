"""Tuner: the entry point that wires storage, the study, the pool and the controller."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from lumos.runtime import PoolFactory, WorkerPoolProtocol, ensure_ray
from lumos.storage import RunStorage
from lumos.tune._internal.callbacks import Callback
from lumos.tune._internal.config import RunConfig, TuneConfig
from lumos.tune._internal.controller import ControllerSettings, TuneController
from lumos.tune._internal.errors import TuneError, TuneTypeError
from lumos.tune._internal.executor import PoolExecutor
from lumos.tune._internal.experiment import (
    Experiment,
    open_experiment,
    quiet_optuna,
    study_journal_path,
)
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.progress import ConsoleReporter
from lumos.tune._internal.result import Result, ResultGrid
from lumos.tune._internal.search_space import ParamSpace, SearchSpace
from lumos.tune._internal.session import SweepInfo, TrialRunner
from lumos.tune._internal.trial import LiveTrial, snapshots

logger = logging.getLogger("lumos.tune")


def _default_name(trainable: Callable[..., Any]) -> str:
    base = getattr(trainable, "__name__", type(trainable).__name__)
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("._-") or "tune"
    return f"{base}-{time.strftime('%Y-%m-%d_%H-%M-%S', time.gmtime())}"


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
        self.trainable = trainable
        self.space = SearchSpace(param_space)
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        self._pool_factory = _pool_factory
        self._name = self.run_config.name or _default_name(trainable)

    @property
    def experiment_name(self) -> str:
        """The experiment's name (``RunConfig.name`` or the generated default)."""
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

        Re-running with the same ``RunConfig(storage_path, name)`` resumes: finished
        trials are not run again, unfinished ones resume from their last checkpoint.

        Returns:
            A :class:`ResultGrid`.

        Raises:
            TuneFailedError: A trial failed and ``TuneConfig(fail_fast=True)``.
            MetricNotReportedError: A trial finished without reporting the metric.
            LeaseHeldError: Another live driver runs this experiment.
        """
        storage = self._run_storage()
        with storage.leased(holder="lumos.tune driver"):
            trials = _Sweep(self, storage).run()
        return self._grid(trials, storage)

    def _grid(self, trials: list[LiveTrial], storage: RunStorage) -> ResultGrid:
        ordered = sorted(trials, key=lambda t: t.number)
        results = [Result.from_trial(t, storage.fs) for t in snapshots(ordered)]
        return ResultGrid(
            results,
            metric=self.tune_config.metric,
            mode=self.tune_config.mode,
            experiment_path=storage.uri,
        )

    @classmethod
    def can_restore(cls, storage_path: str, name: str) -> bool:
        """Whether an experiment exists at ``{storage_path}/{name}`` (``fit()`` resumes it)."""
        storage = RunStorage(storage_path, name)
        return FsJournal(storage.fs, study_journal_path(storage)).exists()


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
        sweep = SweepInfo(
            experiment=storage,
            retention=rc.checkpoint_config.retention(),
            metric=tc.metrics[0] if len(tc.metrics) == 1 else None,
            resources=resources,
        )
        self.executor = PoolExecutor(
            tuner._make_pool(resources),
            TrialRunner(tuner.trainable, sweep),
            available_resources=tuner._available_resources(),
            resources=resources,
        )
        if rc.verbose > 0:
            self.reporter = self._reporter(exp)
        for cb in self.callbacks:
            cb.setup(storage.uri, storage.fs)
        self.controller = TuneController(
            exp,
            tuner.space,
            tc,
            self.executor,
            ControllerSettings(
                max_concurrent_trials=tuner._max_concurrent(target),
                max_failures=rc.failure_config.max_failures,
            ),
            callbacks=self.callbacks,
            progress=self.reporter,
            resources=resources,
        )
        return self.controller

    def _reporter(self, exp: Experiment) -> ConsoleReporter:
        tc, rc = self.tuner.tune_config, self.tuner.run_config
        reporter = ConsoleReporter(tc.metrics, verbose=rc.verbose)
        reporter.set_mode(tc.modes[0] if tc.modes else None)
        if exp.resumed:
            done = sum(1 for t in exp.trials if t.status.is_finished)
            reporter.console.print(
                f"Resuming experiment {self.storage.uri}: {done} finished trial(s) kept, "
                f"{sum(1 for t in exp.trials if not t.status.is_finished)} to resume",
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
                logger.warning("could not record the experiment status", exc_info=True)
        all_trials = self.controller.trials if self.controller is not None else []
        if self.callbacks:
            frozen = snapshots(all_trials)
            for cb in self.callbacks:
                cb.on_experiment_end(frozen)
        if self.reporter is not None:
            self.reporter.close(all_trials)
