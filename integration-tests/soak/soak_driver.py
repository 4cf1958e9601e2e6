"""A soak driver: one Train run or one Tune-over-Train sweep, connected to the harness's cluster.

The harness starts it as a subprocess so it can SIGKILL it and start it again with
the same arguments (the same ``RunConfig``), which resumes the run / the sweep.

    python soak_driver.py train --address A --spec JSON
    python soak_driver.py sweep --address A --spec JSON

``--spec`` holds the storage (``storage_path``, optional S3 ``endpoint``), the name and
the training loop's config. It prints ``DRIVER {"pid", "ray_job"}`` once connected and,
on success, one JSON line ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _filesystem(spec: dict[str, Any]) -> Any:
    endpoint = spec.get("endpoint")
    if not endpoint:
        return None
    from lumos.storage import testing

    fs = testing.s3_filesystem(endpoint)
    if spec.get("faults_file") and hasattr(testing, "FaultyFileSystem"):
        from soak_s3fs import MultipartFaultyFileSystem

        # Off until the harness switches it on through the control file (in every
        # process that has the filesystem: this driver and the Train workers). Its
        # uploads go in 5 MiB parts (soak_s3fs.py): the big shards are multipart.
        fs = MultipartFaultyFileSystem(
            fs,
            seed=spec["seed"],
            enabled=False,
            max_consecutive=2,
            control_file=spec["faults_file"],
            record_dir=spec["faults_records"],
        )
    return fs


def run_train(spec: dict[str, Any]) -> dict[str, Any]:
    import soak_workloads

    from lumos import train
    from lumos.train.torch import TorchTrainer

    fn, scaling, torch_config = soak_workloads.train_fn, train.ScalingConfig(num_workers=2), None
    if spec.get("torchft"):  # every rank a torchft replica; an elastic group of 2 to 3
        from lumos.train.torch import TorchftConfig

        fn, torch_config = soak_workloads.ft_train_fn, TorchftConfig(timeout_s=30.0)
        scaling = train.ScalingConfig(num_workers=(2, 3), elastic_resize_monitor_interval_s=2.0)
    result = TorchTrainer(
        fn,
        train_loop_config=spec["loop"],
        torch_config=torch_config,
        scaling_config=scaling,
        run_config=train.RunConfig(
            name=spec["name"],
            storage_path=spec["storage_path"],
            storage_filesystem=_filesystem(spec),
            verbose=1,
            failure_config=train.FailureConfig(
                max_failures=-1,
                health_check_timeout_s=spec["health_check_timeout_s"],
                hang_timeout_s=spec.get("hang_timeout_s", 600.0),
            ),
            checkpoint_config=train.CheckpointConfig(num_to_keep=spec["num_to_keep"]),
        ),
        validation_config=train.ValidationConfig(
            soak_workloads.validate,
            task_config=train.ValidationTaskConfig(
                fn_kwargs={
                    "ledger_dir": spec["loop"]["ledger_dir"],
                    "sleep_s": spec["validate_s"],
                },
                timeout_s=120,
            ),
            ray_remote_kwargs={"num_cpus": 0},
        ),
    ).fit()
    return {"metrics": result.metrics, "error": None if result.error is None else str(result.error)}


def run_sweep(spec: dict[str, Any]) -> dict[str, Any]:
    import optuna
    import soak_workloads

    from lumos import tune
    from lumos.tune.schedulers import ASHAScheduler

    grid = tune.Tuner(
        soak_workloads.trial_fn,
        param_space={
            "x": tune.uniform(0.0, 3.0),
            "loop": spec["loop"],
            "ledger_dir": spec["loop"]["ledger_dir"],
            "sweep": spec["name"],
            "health_check_timeout_s": spec["health_check_timeout_s"],
            "hang_timeout_s": spec.get("hang_timeout_s", 600.0),
        },
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=spec["num_samples"],
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            sampler=optuna.samplers.TPESampler(seed=spec["seed"]),
            scheduler=ASHAScheduler(
                grace_period=2, reduction_factor=2, max_t=spec["loop"]["steps"]
            ),
        ),
        run_config=tune.RunConfig(
            name=spec["name"],
            storage_path=spec["storage_path"],
            storage_filesystem=_filesystem(spec),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=-1),
        ),
    ).fit()
    return {
        "trials": [
            {
                "trial": r.trial_name,
                "status": r.status,
                "x": r.config["x"],
                "metrics": r.metrics,
                "error": None if r.error is None else str(r.error),
            }
            for r in grid
        ]
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["train", "sweep"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    spec = json.loads(args.spec)
    sys.path.insert(0, HERE)

    import time

    import ray

    ray.init(
        address=args.address,
        job_config=ray.job_config.JobConfig(code_search_path=[HERE]),
        log_to_driver=False,
    )
    # Who this driver is, for the harness: its Ray job id is in every ledger line its
    # workers write (the lease check tells two drivers of one run apart by it).
    job_id = ray.get_runtime_context().get_job_id()
    print(
        "DRIVER " + json.dumps({"pid": os.getpid(), "ray_job": job_id, "t": time.time()}),
        flush=True,
    )
    out = run_train(spec) if args.kind == "train" else run_sweep(spec)
    print("RESULT " + json.dumps(out, default=str), flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
