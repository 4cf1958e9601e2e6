"""User-facing configs of lumos.tune (pydantic models, validated at construction)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lumos import runtime, storage
from lumos.runtime import validate_resources
from lumos.storage import validate_name
from lumos.tune._internal.callbacks import Callback
from lumos.tune._internal.config_fields import RUN_ONLY, TUNE_ONLY, check_fields
from lumos.tune._internal.pbt import PopulationBasedTraining
from lumos.tune._internal.ray_compat import normalise_tune_config

Mode = Literal["min", "max"]
StopCallable = Callable[[str, dict[str, Any]], bool]


def _check_mode(value: Any) -> None:
    if value not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {value!r}")


class FailureConfig(runtime.FailureConfig):
    """How often a failed trial is retried, and when a silent trial counts as hung.

    Tune applies the runtime's failure policy
    (``lumos.runtime.DefaultFailurePolicy(max_failures)``) to each trial.

    Args:
        max_failures: Retries per trial after an error (0: none, -1: unlimited). A retry
            resumes from the trial's last checkpoint (``tune.get_checkpoint()``).
        health_check_timeout_s: A trial's actor that does not answer its health check
            for this many seconds is declared hung, killed and its trial fails
            (retried per ``max_failures``). Default 30 s: a busy machine can delay a
            healthy actor's answer by several seconds.
        fail_fast: Ray's place for ``TuneConfig(fail_fast=True)`` (either works).

    Example:
        >>> tune.RunConfig(failure_config=tune.FailureConfig(max_failures=2))
    """

    fail_fast: bool | str = False

    @field_validator("fail_fast")
    @classmethod
    def _fail_fast(cls, value: bool | str) -> bool | str:
        if isinstance(value, str) and value != "raise":
            raise ValueError(f"fail_fast={value!r}: give True, False or 'raise'")
        return value


class CheckpointConfig(storage.CheckpointConfig):
    """Per-trial checkpoint retention (``lumos.storage.CheckpointConfig``) plus Ray's
    ``checkpoint_frequency`` / ``checkpoint_at_end`` for ``tune.Trainable`` classes.

    Args:
        num_to_keep: Keep at most this many checkpoints per trial (the latest always).
        checkpoint_score_attribute: Metric that ranks checkpoints for retention.
        checkpoint_score_order: ``"max"`` or ``"min"``.
        checkpoint_frequency: A ``tune.Trainable`` saves every this many steps
            (0: its class attribute ``checkpoint_frequency`` decides).
        checkpoint_at_end: A ``tune.Trainable`` saves when it ends with ``done``
            (default: yes when it saves at all).

    Example:
        >>> tune.RunConfig(checkpoint_config=tune.CheckpointConfig(
        ...     num_to_keep=4, checkpoint_score_attribute="acc", checkpoint_frequency=5))
    """

    checkpoint_frequency: int = Field(default=0, ge=0)
    checkpoint_at_end: bool | None = None


class RunConfig(runtime.RunConfig):
    """Where the experiment lives and how it reports.

    Running the same script again with the same ``storage_path`` and ``name``
    resumes the experiment if it is the same sweep (trainable, metric, mode, search
    space, sampler): finished trials are kept, unfinished ones resume from their last
    checkpoint and the Optuna study keeps its history. Another sweep stored under
    that name is kept untouched and this one runs beside it (``name-2``).

    Args:
        name: Experiment name (a directory under ``storage_path``). Default:
            ``"<trainable name>-<UTC timestamp>-<6 hex digits>"`` (a new experiment
            each run, even two started in the same second).
        storage_path: Local path or fsspec URL (``s3://bucket/sweeps``); default
            ``~/lumos_results``.
        storage_filesystem: An fsspec filesystem to use instead of guessing from the URL.
        failure_config: Trial retries and the health-check timeout of trial actors.
        checkpoint_config: Per-trial checkpoint retention.
        callbacks: :class:`~lumos.tune.Callback` objects called in the driver.
        verbose: 0 silent, 1 progress table and summary, 2 also one line per finished trial.
        stop: As ``TuneConfig(stop=...)`` (Ray Tune puts it here); not both.
        if_exists: When ``name`` already holds an experiment: ``"resume"`` (default)
            resumes it if it is the same sweep (a finished one returns its stored
            results), else runs this sweep beside it as ``name-2``; ``"error"``
            refuses; ``"new"`` always starts a new experiment beside it.

    Example:
        >>> tune.RunConfig(name="sweep-7", storage_path="s3://bucket/sweeps")
    """

    callback_type: ClassVar[type] = Callback

    def __init__(self, **data: Any) -> None:
        check_fields("RunConfig", data, type(self).model_fields, ("TuneConfig", TUNE_ONLY))
        super().__init__(**data)

    failure_config: FailureConfig = Field(default_factory=FailureConfig)
    stop: dict[str, float] | Callable[..., bool] | None = None
    """Ray's place for ``TuneConfig(stop=...)`` (the same values; give it in one place)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return validate_name(value, field="RunConfig.name")

    @field_validator("failure_config", mode="before")
    @classmethod
    def _tune_failure_config(cls, value: Any) -> Any:
        if isinstance(value, runtime.FailureConfig) and not isinstance(value, FailureConfig):
            return FailureConfig(**value.model_dump(exclude_unset=True))
        return value

    @field_validator("callbacks", mode="before")
    @classmethod
    def _check_callbacks(cls, value: Any) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise ValueError(f"callbacks must be a list of tune.Callback instances, got {value!r}")
        for cb in value:
            if not isinstance(cb, Callback):
                raise ValueError(
                    f"callbacks must be tune.Callback instances, got {type(cb).__name__}"
                )
        return list(value)

    def callback_objects(self) -> list[Callback]:
        """The callbacks, typed."""
        return list(self.callbacks)


class TuneConfig(BaseModel):
    """What to search and how.

    Args:
        metric: The reported metric to optimize, or a list for multi-objective search.
        mode: ``"min"`` or ``"max"`` (a list matching ``metric`` for multi-objective).
        sampler: Any Optuna sampler (default ``TPESampler``; ``NSGAIISampler`` for
            multi-objective). Seed it for reproducible runs.
        pruner: Any Optuna pruner (``SuccessiveHalvingPruner`` = ASHA, ``HyperbandPruner``,
            ``MedianPruner``, ...). Each ``tune.report`` is one step.
        scheduler: A :class:`~lumos.tune.PopulationBasedTraining` (not together with
            ``pruner``; needs a single ``metric`` and ``mode``), or one of Ray's
            early-stopping schedulers from ``lumos.tune.schedulers`` (``ASHAScheduler``,
            ``HyperBandScheduler``, ``MedianStoppingRule``, ``FIFOScheduler``), which
            become the matching Optuna ``pruner``.
        search_alg: Ray's spelling: ``lumos.tune.search.optuna.OptunaSearch(sampler=...)``
            (optionally in a ``ConcurrencyLimiter``) sets ``sampler`` (and
            ``max_concurrent_trials``); other Ray searchers are an error naming the
            Optuna sampler to use.
        trial_name_creator: ``(tune.Trial) -> str``: each new trial's name (shown in the
            console, ``Result.trial_name``, ``tune.get_context().get_trial_name()``).
        trial_dirname_creator: ``(tune.Trial) -> str``: each new trial's directory name
            in the experiment (letters, digits, ``._-``; a clash gets ``_<trial id>``).
        num_samples: Number of trials (times the grid size when the space has grid
            searches). -1: keep starting trials until ``time_budget_s`` runs out.
        max_concurrent_trials: Trials running at once (default: as many as the
            cluster's CPUs fit with ``trial_resources``).
        time_budget_s: Stop starting trials after this long and stop running ones.
        stop: Stop a trial when a reported metric reaches a value
            (``{"training_iteration": 10}`` stops at or above 10), or a callable
            ``(trial_id, result) -> bool``.
        trial_resources: Ray resources each trial's actor reserves (default
            ``{"CPU": 1}``). A trial that launches a trainer needs little
            (``{"CPU": 0}`` or a number, meaning CPUs).
        points_to_evaluate: Configs (flat param names -> values) to try first.
        fail_fast: At the first trial error (after retries): ``True`` stops the sweep and
            ``fit()`` returns the ``ResultGrid`` with the errored trial (Ray's
            ``FailureConfig(fail_fast=True)``); ``"raise"`` raises ``TuneFailedError``
            with the trial's error.
        health_check_timeout_s: Deprecated: set
            ``RunConfig(failure_config=FailureConfig(health_check_timeout_s=...))``.
            Setting it here still works (it wins over the ``FailureConfig`` default)
            and emits a ``FutureWarning``.

    Example:
        >>> tune.TuneConfig(metric="loss", mode="min", num_samples=50,
        ...                 sampler=optuna.samplers.TPESampler(seed=0),
        ...                 pruner=optuna.pruners.SuccessiveHalvingPruner())
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        check_fields("TuneConfig", data, type(self).model_fields, ("RunConfig", RUN_ONLY))
        super().__init__(**data)

    metric: str | list[str] | None = None
    mode: Mode | list[Mode] | None = None
    sampler: optuna.samplers.BaseSampler | None = None
    pruner: optuna.pruners.BasePruner | None = None
    scheduler: PopulationBasedTraining | None = None
    search_alg: Any = None
    reuse_actors: bool | None = None
    """Accepted for Ray scripts and ignored: lumos always reuses trial actors."""
    trial_name_creator: Callable[..., str] | None = None
    trial_dirname_creator: Callable[..., str] | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = Field(default=None, ge=1)
    time_budget_s: float | None = Field(default=None, gt=0)
    stop: dict[str, float] | Callable[..., bool] | None = None
    trial_resources: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0})
    points_to_evaluate: list[dict[str, Any]] | None = None
    fail_fast: bool | Literal["raise"] = False
    health_check_timeout_s: float = Field(default=30.0, gt=0)
    """Deprecated alias of ``FailureConfig.health_check_timeout_s``."""

    @model_validator(mode="before")
    @classmethod
    def _ray_spellings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return normalise_tune_config(data)
        return data

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            for v in value:
                _check_mode(v)
            return list(value)
        _check_mode(value)
        return value

    @field_validator("metric", mode="before")
    @classmethod
    def _metric(cls, value: Any) -> Any:
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, list):
            if not value:
                raise ValueError("metric=[] names no metric; give a name or a list of names")
            if len(set(value)) != len(value):
                raise ValueError(f"metric={value!r} names a metric twice")
        return value

    @field_validator("num_samples")
    @classmethod
    def _num_samples(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError(
                f"num_samples must be >= 1, or -1 to run until time_budget_s; got {value}"
            )
        return value

    @field_validator("trial_resources", mode="before")
    @classmethod
    def _resources(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"trial_resources must be a dict or a CPU count, got {value!r}")
        if isinstance(value, (int, float)):
            value = {"CPU": float(value)}
        if isinstance(value, Mapping):
            validate_resources(dict(value), "trial_resources", allow_zero=True)
        return value

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, PopulationBasedTraining):
            raise ValueError(
                f"scheduler={value!r}: give tune.PopulationBasedTraining(...); to stop bad "
                "trials early give an Optuna pruner as TuneConfig(pruner=...)"
            )
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, Mapping) and not callable(value):
            raise ValueError(
                f"stop={value!r}: give a dict of metric bounds or a callable (trial_id, result) -> bool"
            )
        if isinstance(value, Mapping):
            for key, bound in value.items():
                if not isinstance(bound, (int, float)):
                    raise ValueError(f"stop[{key!r}]={bound!r}: bounds must be numbers")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TuneConfig:
        metric, mode = self.metric, self.mode
        if mode is not None and metric is None:
            raise ValueError(f"mode={mode!r} is set but metric is not; set metric too")
        if metric is not None and mode is None:
            raise ValueError(f"metric={metric!r} needs mode='min' or mode='max'")
        if isinstance(metric, list) != isinstance(mode, list):
            raise ValueError(
                f"metric={metric!r} and mode={mode!r}: give both as lists "
                "(multi-objective) or both as single values"
            )
        if isinstance(metric, list) and isinstance(mode, list) and len(metric) != len(mode):
            raise ValueError(f"metric={metric!r} and mode={mode!r} must have the same length")
        if (
            isinstance(metric, list)
            and len(metric) > 1
            and self.pruner is not None
            and not isinstance(self.pruner, optuna.pruners.NopPruner)
        ):
            raise ValueError(
                f"pruner={type(self.pruner).__name__} cannot prune a multi-objective search "
                f"(metric={metric!r}); Optuna pruners need a single metric"
            )
        self._check_scheduler()
        if self.num_samples == -1 and self.time_budget_s is None:
            raise ValueError("num_samples=-1 runs until time_budget_s, so set time_budget_s")
        if "health_check_timeout_s" in self.model_fields_set:
            warnings.warn(
                "TuneConfig(health_check_timeout_s=...) is deprecated and will be removed; "
                "set RunConfig(failure_config=FailureConfig(health_check_timeout_s=...)) "
                "instead",
                FutureWarning,
                stacklevel=2,
            )
        return self

    def _check_scheduler(self) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        name = type(scheduler).__name__
        if self.pruner is not None and not isinstance(self.pruner, optuna.pruners.NopPruner):
            raise ValueError(
                f"scheduler={name} and pruner={type(self.pruner).__name__} were both given; "
                "population-based training decides which trials go on by itself: drop the pruner"
            )
        if self.metric is None or (isinstance(self.metric, list) and len(self.metric) != 1):
            raise ValueError(
                f"scheduler={name} needs one metric to rank trials: set "
                f"TuneConfig(metric='loss', mode='min'), got metric={self.metric!r}"
            )

    # helpers -------------------------------------------------------------

    @property
    def metrics(self) -> list[str]:
        """The metric names (empty when no metric is set)."""
        if self.metric is None:
            return []
        return list(self.metric) if isinstance(self.metric, list) else [self.metric]

    @property
    def modes(self) -> list[str]:
        """The modes, aligned with :attr:`metrics`."""
        if self.mode is None:
            return []
        return list(self.mode) if isinstance(self.mode, list) else [self.mode]

    @property
    def multi_objective(self) -> bool:
        """Whether more than one metric is optimized."""
        return len(self.metrics) > 1

    def effective_health_check_timeout_s(self, failure_config: runtime.FailureConfig) -> float:
        """The health-check timeout of trial actors: ``failure_config``'s unless only the
        deprecated ``TuneConfig(health_check_timeout_s=...)`` was set."""
        if (
            "health_check_timeout_s" in self.model_fields_set
            and "health_check_timeout_s" not in failure_config.model_fields_set
        ):
            return self.health_check_timeout_s
        return failure_config.health_check_timeout_s

    def directions(self) -> list[Literal["minimize", "maximize"]]:
        """Optuna study directions."""
        if not self.metrics:
            return ["minimize"]
        return ["minimize" if m == "min" else "maximize" for m in self.modes]
