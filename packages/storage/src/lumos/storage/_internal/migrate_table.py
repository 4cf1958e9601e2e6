"""What ``lumos migrate`` knows: Ray Train / Tune names and the lumos name each becomes.

Data only (no Ray, no lumos.train or lumos.tune import: names are strings); the lookup
rules are in :mod:`lumos.storage._internal.migrate_resolve`. Every target here must
exist in the installed lumos packages (lumos-tune's tests check it name by name).

- :data:`MODULES`: a Ray module -> the lumos module with the same names.
- :data:`RAY_ALIASES`: a deeper Ray module -> the public Ray module that re-exports
  its names (``ray.train.v2.api.config`` -> ``ray.train``).
- :data:`NAMES`: a Ray name -> its lumos name (renamed where lumos spells it otherwise).
- :data:`AMBIGUOUS`: a ``ray.air`` name -> ``(Train target, Tune target)``: a file that
  uses Ray Tune gets the Tune one.
- :data:`MISSING`: a Ray name or module with no lumos equivalent -> why, and the way out.
- :data:`MODULE_NOTES`: why a name a Ray module has but this table lacks is missing.
"""

from __future__ import annotations

OURS = ("ray.train", "ray.tune", "ray.air")
"""The Ray packages ``lumos migrate`` rewrites; the rest of Ray (``ray.init``,
``ray.remote``, ``ray.data``, ...) is left alone."""


def _same(ray_module: str, lumos_module: str, names: str) -> dict[str, str]:
    """``{ray_module.N: lumos_module.N}`` for each space-separated name ``N``."""
    return {f"{ray_module}.{n}": f"{lumos_module}.{n}" for n in names.split()}


def _why(ray_modules: str, names: str, reason: str) -> dict[str, str]:
    """``{M.N: reason}`` for each space-separated module ``M`` and name ``N``."""
    return {f"{m}.{n}": reason for m in ray_modules.split() for n in names.split()}


MODULES: dict[str, str] = {
    "ray.train": "lumos.train",
    "ray.train.torch": "lumos.train.torch",
    "ray.train.lightning": "lumos.train.lightning",
    "ray.train.huggingface": "lumos.train.huggingface",
    "ray.train.huggingface.transformers": "lumos.train.huggingface.transformers",
    "ray.tune": "lumos.tune",
    "ray.tune.schedulers": "lumos.tune.schedulers",
    "ray.tune.search": "lumos.tune.search",
    "ray.tune.search.optuna": "lumos.tune.search.optuna",
    "ray.tune.stopper": "lumos.tune.stopper",
    "ray.tune.logger": "lumos.tune.logger",
    "ray.tune.result": "lumos.tune.result",
    "ray.tune.integration": "lumos.tune.integration",
    "ray.tune.integration.ray_train": "lumos.tune.integration.ray_train",
    "ray.tune.utils": "lumos.tune.utils",
    "ray.tune.utils.mock_trainable": "lumos.tune.utils.mock_trainable",
}
"""A Ray module -> the lumos module that has (some of) its names."""

_TRAIN_V2 = (
    "callback config context data_parallel_trainer exceptions preemption report_config "
    "reported_checkpoint result train_fn_utils validation_config"
)

RAY_ALIASES: dict[str, str] = {
    "ray.train.v2": "ray.train",
    "ray.train.v2.api": "ray.train",
    **{f"ray.train.v2.api.{m}": "ray.train" for m in _TRAIN_V2.split()},
    "ray.train.context": "ray.train",
    "ray.train.data_parallel_trainer": "ray.train",
    "ray.train.v2.torch": "ray.train.torch",
    **{
        f"ray.train.{p}torch.{m}": "ray.train.torch"
        for p in ("", "v2.")
        for m in ("config", "torch_trainer", "train_loop_utils")
    },
    **{
        f"ray.tune.{m}": "ray.tune"
        for m in (
            "tuner",
            "tune_config",
            "trainable",
            "callback",
            "context",
            "error",
            "result_grid",
            "experiment",
            "experiment.trial",
            "search.sample",
        )
    },
    **{
        f"ray.tune.schedulers.{m}": "ray.tune.schedulers"
        for m in ("async_hyperband", "hyperband", "median_stopping_rule", "pbt", "trial_scheduler")
    },
    "ray.tune.search.concurrency_limiter": "ray.tune.search",
    "ray.tune.search.optuna.optuna_search": "ray.tune.search.optuna",
    **{
        f"ray.tune.stopper.{m}": "ray.tune.stopper"
        for m in (
            "stopper",
            "function_stopper",
            "maximum_iteration",
            "noop",
            "timeout",
            "trial_plateau",
            "experiment_plateau",
        )
    },
    **{
        f"ray.tune.logger.{m}": "ray.tune.logger" for m in ("csv", "json", "tensorboardx", "logger")
    },
    "ray.air.config": "ray.air",
    "ray.air.result": "ray.air",
}
"""A deeper Ray module -> the public Ray module whose names it holds."""

NAMES: dict[str, str] = {
    **_same(
        "ray.train",
        "lumos.train",
        "Checkpoint CheckpointConfig CheckpointConsistencyMode CheckpointUploadMode "
        "ControllerError DataConfig DataParallelTrainer FailureConfig PreemptionInfo "
        "ReportedCheckpoint ReportedCheckpointStatus Result RunConfig ScalingConfig "
        "TrainContext TrainingFailedError UserCallback ValidationConfig ValidationTaskConfig "
        "WorkerGroupError "
        "get_all_reported_checkpoints get_checkpoint get_context get_dataset_shard "
        "get_preemption_info report",
    ),
    **_same(
        "ray.train.torch",
        "lumos.train.torch",
        "TorchConfig TorchTrainer get_device prepare_data_loader prepare_model",
    ),
    "ray.train.lightning.prepare_trainer": "lumos.train.lightning.prepare_trainer",
    "ray.train.lightning.RayTrainReportCallback": "lumos.train.lightning.ReportCallback",
    "ray.train.lightning.RayDDPStrategy": "lumos.train.lightning.LumosDDPStrategy",
    "ray.train.lightning.RayLightningEnvironment": "lumos.train.lightning.LumosLightningEnvironment",
    "ray.train.huggingface.transformers.prepare_trainer": (
        "lumos.train.huggingface.transformers.prepare_trainer"
    ),
    "ray.train.huggingface.transformers.RayTrainReportCallback": (
        "lumos.train.huggingface.transformers.ReportCallback"
    ),
    **_same(
        "ray.tune",
        "lumos.tune",
        "Callback Checkpoint CheckpointConfig FailureConfig Result ResultGrid RunConfig Stopper "
        "Trainable Trial TuneConfig TuneError Tuner choice create_scheduler create_searcher "
        "get_checkpoint get_context "
        "grid_search lograndint loguniform qlograndint qloguniform qrandint qrandn quniform "
        "randint randn report sample_from uniform with_parameters with_resources",
    ),
    "ray.tune.TuneContext": "lumos.tune.TrialContext",
    **_same(
        "ray.tune.schedulers",
        "lumos.tune.schedulers",
        "ASHAScheduler AsyncHyperBandScheduler FIFOScheduler HyperBandScheduler "
        "MedianStoppingRule PopulationBasedTraining create_scheduler",
    ),
    **_same(
        "ray.tune.search", "lumos.tune.search", "ConcurrencyLimiter create_searcher grid_search"
    ),
    "ray.tune.search.optuna.OptunaSearch": "lumos.tune.search.optuna.OptunaSearch",
    **_same(
        "ray.tune.stopper",
        "lumos.tune.stopper",
        "CombinedStopper ExperimentPlateauStopper FunctionStopper MaximumIterationStopper "
        "NoopStopper Stopper TimeoutStopper TrialPlateauStopper",
    ),
    **_same(
        "ray.tune.logger", "lumos.tune.logger", "CSVLoggerCallback LoggerCallback TBXLoggerCallback"
    ),
    "ray.tune.logger.JsonLoggerCallback": "lumos.tune.logger.JSONLoggerCallback",
    **_same(
        "ray.tune.result",
        "lumos.tune.result",
        "DONE EPISODE_REWARD_MEAN MEAN_ACCURACY MEAN_LOSS SHOULD_CHECKPOINT TRAINING_ITERATION",
    ),
    "ray.tune.integration.ray_train.TuneReportCallback": (
        "lumos.tune.integration.ray_train.TuneReportCallback"
    ),
    "ray.tune.utils.mock_trainable.MyTrainableClass": (
        "lumos.tune.utils.mock_trainable.MyTrainableClass"
    ),
    "ray.air.ScalingConfig": "lumos.train.ScalingConfig",
    "ray.air.integrations.mlflow.setup_mlflow": "lumos.train.integrations.mlflow.setup_mlflow",
    "ray.air.integrations.wandb.setup_wandb": "lumos.train.integrations.wandb.setup_wandb",
}
"""A Ray name -> its lumos name (``module.Name``)."""

AMBIGUOUS: dict[str, tuple[str, str]] = {
    **{
        f"ray.air.{n}": (f"lumos.train.{n}", f"lumos.tune.{n}")
        for n in ("RunConfig", "CheckpointConfig", "FailureConfig", "Result")
    },
    **{
        f"ray.air.integrations.{m}.{n}": (
            f"lumos.train.integrations.{m}.{n}",
            f"lumos.tune.integrations.{m}.{n}",
        )
        for m, n in (("mlflow", "MLflowLoggerCallback"), ("wandb", "WandbLoggerCallback"))
    },
}
"""A Ray name used by both Ray Train and Ray Tune -> ``(Train target, Tune target)``."""

_REPORTERS = "lumos prints its own progress table: drop the reporter (RunConfig(verbose=0/1/2))"
_SEARCHERS = (
    "lumos searches with Optuna: use OptunaSearch, or any Optuna sampler in TuneConfig(sampler=...)"
)
_SCHEDULERS = (
    "lumos's schedulers are Optuna pruners (ASHA, HyperBand, median stopping, FIFO) and its "
    "own PopulationBasedTraining; or pass any Optuna pruner in TuneConfig(pruner=...)"
)
_NO_SYNC = "lumos writes to RunConfig(storage_path=...) directly: nothing to sync; drop it"
_PG_FACTORY = "use tune.with_resources(trainable, {'cpu': n, 'gpu': m})"
_TORCH_AMP = "use torch.autocast and torch.amp.GradScaler directly"

MISSING: dict[str, str] = {
    **_why(
        "ray.train",
        "BackendConfig",
        "lumos has no pluggable backend: TorchTrainer sets up "
        "torch.distributed (configure it with lumos.train.torch.TorchConfig)",
    ),
    **_why(
        "ray.train",
        "PreemptionError",
        "a failed lumos run raises lumos.train.TrainingFailedError (every worker's error inside)",
    ),
    **_why(
        "ray.train",
        "LoggingConfig",
        "lumos logs through the 'lumos.train' logger: configure Python logging",
    ),
    **_why("ray.train ray.tune", "SyncConfig", _NO_SYNC),
    **_why("ray.train", "TRAIN_DATASET_KEY", "use the string 'train'"),
    **_why("ray.train", "ValidationFn", "type the validation function as a plain Callable"),
    **_why(
        "ray.train.torch",
        "TorchCheckpoint",
        "torch.save into a directory and use lumos.train.Checkpoint.from_directory",
    ),
    **_why("ray.train.torch", "accelerate backward", _TORCH_AMP),
    **_why(
        "ray.train.torch",
        "enable_reproducibility",
        "seed torch yourself (torch.manual_seed, torch.use_deterministic_algorithms)",
    ),
    **_why("ray.train.torch", "get_devices", "use lumos.train.torch.get_device()"),
    **_why("ray.train.torch", "prepare_optimizer", "not needed: use the optimizer as it is"),
    **_why(
        "ray.train.lightning",
        "RayFSDPStrategy RayDeepSpeedStrategy",
        "lumos runs Lightning with DDP only (lumos.train.lightning.LumosDDPStrategy)",
    ),
    **_why("ray.tune", "CLIReporter JupyterNotebookReporter ProgressReporter", _REPORTERS),
    **_why(
        "ray.tune",
        "run run_experiments Experiment",
        "use tune.Tuner(trainable, param_space=..., tune_config=..., run_config=...).fit()",
    ),
    **_why(
        "ray.tune",
        "ExperimentAnalysis",
        "use the ResultGrid that Tuner.fit() returns "
        "(or Tuner.restore(path, trainable).get_results(), or tune.load_study(path))",
    ),
    **_why("ray.tune", "PlacementGroupFactory", _PG_FACTORY),
    **_why(
        "ray.tune",
        "ResumeConfig",
        "pass resume_unfinished / resume_errored / "
        "restart_errored to tune.Tuner.restore(path, trainable, ...)",
    ),
    **_why(
        "ray.tune",
        "register_trainable register_env",
        "pass the trainable itself to tune.Tuner (lumos has no registry)",
    ),
    **_why("ray.tune.schedulers", "pb2 PB2 hb_bohb", _SCHEDULERS),
    **_why("ray.tune.search", "ax bayesopt bohb hebo hyperopt nevergrad zoopt", _SEARCHERS),
    **_why("ray.tune.search", "BasicVariantGenerator Repeater", _SEARCHERS),
    **_why(
        "ray.tune.search",
        "Searcher SearchAlgorithm SearchGenerator",
        "write an Optuna sampler (optuna.samplers.BaseSampler) instead",
    ),
    **_why(
        "ray.tune.search",
        "UNRESOLVED_SEARCH_SPACE UNDEFINED_SEARCH_SPACE UNDEFINED_METRIC_MODE",
        "Ray's internal message strings: drop them",
    ),
    **_why("ray.tune.logger", "pretty_print", "print(result.metrics)"),
    "ray.train.collective": "use torch.distributed.barrier() / broadcast_object_list on the "
    "process group lumos forms",
    **_why(
        "ray.tune.logger",
        "Logger CSVLogger JsonLogger TBXLogger",
        "use the lumos.tune.logger *LoggerCallback classes",
    ),
    **_why(
        "ray.tune.logger",
        "aim comet mlflow wandb",
        "lumos has MLflow and W&B callbacks "
        "in lumos.tune.integrations.mlflow / .wandb, and no Aim or Comet one",
    ),
    **_why(
        "ray.train",
        "horovod tensorflow xgboost lightgbm jax",
        "lumos trains PyTorch (lumos.train.torch, .lightning, .huggingface.transformers) only",
    ),
    **_why(
        "ray.train ray.tune",
        "examples",
        "Ray's example modules are not in lumos: copy what the script needs into it",
    ),
    "ray.tune.execution": "Ray Tune's execution internals are not in lumos",
    "ray.tune.execution.placement_groups.PlacementGroupFactory": _PG_FACTORY,
    "ray.air": "ray.air has no single lumos module: import its names (ScalingConfig, "
    "RunConfig, ...) from lumos.train or lumos.tune",
    "ray.air.session": "Ray's old session API: use lumos.train.report / get_checkpoint / "
    "get_context (or lumos.tune's)",
    **_why(
        "ray.air.integrations",
        "mlflow wandb",
        "no single lumos module: import its names "
        "(the logger callback from lumos.tune.integrations, setup_* from "
        "lumos.train.integrations)",
    ),
    "ray.air.integrations": "lumos has MLflow and W&B integrations only (import their names)",
}
"""A Ray name or module with no lumos equivalent -> why, and the way out."""

MODULE_NOTES: dict[str, str] = {
    "ray.tune.result": "lumos fills 'training_iteration' only: Ray's other automatic result "
    "keys are not in a lumos result",
    "ray.tune.search": _SEARCHERS,
    "ray.tune.schedulers": _SCHEDULERS,
    "ray.tune.integration": "lumos has no framework callbacks here (ray_train only): call "
    "tune.report(...) from a callback of your own",
    "ray.tune.utils": "lumos has mock_trainable only of Ray Tune's utilities",
}
"""Why a Ray module's name missing from this table has no lumos equivalent."""
