"""The lumos demo: tune a PyTorch classifier on scikit-learn's digits, each trial a DDP run.

A ``tune.Tuner`` (TPE sampler, seeded; successive-halving pruner = ASHA) searches
the learning rate, hidden width and batch size of a small MLP. Every trial is a
2-worker ``TorchTrainer`` run (DDP through ``prepare_model`` and
``prepare_data_loader``) that checkpoints every epoch. The trial function only
builds the trainer and calls ``fit()``: the Train run writes under the trial's
directory, its reports reach the pruner and the live table, and a pruned trial's
workers stop. At the end the best trial's checkpoint is loaded and evaluated on a
held-out test split that tuning never saw.

    python examples/demo_tune_over_train.py          # or: nox -s demo

Exits with status 1 when the test accuracy is below ``--min-accuracy`` (0.95).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import digits
import optuna

from lumos import train, tune
from lumos.train.torch import TorchTrainer

#: Ray CPUs of the local cluster: two trials at once, each 2 workers x 1 CPU plus
#: 0.5 CPU for the trial's actor, which only drives its Train run.
NUM_CPUS = 5
TRIAL_CPUS = 0.5
NUM_WORKERS = 2


def trial(config: dict[str, Any]) -> None:
    """One Tune trial: a 2-worker DDP run. Nothing here is Tune-specific."""
    data = digits.load_splits()  # once per trial actor (actors are reused), not per worker
    TorchTrainer(
        digits.train_fn_per_worker,
        train_loop_config={**config, "data": data},
        scaling_config=train.ScalingConfig(num_workers=NUM_WORKERS),
        run_config=train.RunConfig(
            checkpoint_config=train.CheckpointConfig(num_to_keep=1),
            verbose=False,
        ),
    ).fit()


@dataclass(frozen=True)
class Outcome:
    """What the sweep found."""

    grid: tune.ResultGrid
    best: tune.Result
    run: train.Result  # the best trial's Train run
    checkpoint: train.Checkpoint  # its latest checkpoint (the last reported epoch)


def run_sweep(
    *,
    num_samples: int,
    epochs: int,
    storage_path: str,
    name: str,
    seed: int = 0,
    max_concurrent_trials: int = 2,
    verbose: int = 1,
    storage_filesystem: Any = None,
    points_to_evaluate: list[dict[str, Any]] | None = None,
) -> Outcome:
    """Run the search on the connected Ray cluster and return its outcome.

    Args:
        num_samples: Trials to run.
        epochs: Epochs of a trial that is never pruned.
        storage_path: Where the experiment lives (a local path or an fsspec URL).
        name: The experiment's name; running again with the same name resumes it.
        seed: Seed of the TPE sampler (and of the models).
        max_concurrent_trials: Trials running at once.
        verbose: 0 silent, 1 live table and summary.
        storage_filesystem: fsspec filesystem for ``storage_path`` (e.g. S3).
        points_to_evaluate: Configs (``lr``, ``width``, ``batch_size``) to try first.
    """
    tuner = tune.Tuner(
        trial,
        param_space={
            "lr": tune.loguniform(1e-3, 5e-2),
            "width": tune.choice([16, 32, 64, 128, 256]),
            "batch_size": tune.choice([16, 32, 64, 128]),
            "epochs": epochs,
            "seed": seed,
        },
        tune_config=tune.TuneConfig(
            metric="val_accuracy",
            mode="max",
            num_samples=num_samples,
            max_concurrent_trials=max_concurrent_trials,
            trial_resources={"CPU": TRIAL_CPUS},
            points_to_evaluate=points_to_evaluate,
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
            pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=3),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            verbose=verbose,
        ),
    )
    grid = tuner.fit()
    best = grid.get_best_result()
    run = train.Result.from_path(f"{best.path.rstrip('/')}/train", storage_filesystem)
    if run.checkpoint is None:
        raise RuntimeError(f"the best trial {best.trial_name} has no checkpoint in {run.path}")
    return Outcome(grid=grid, best=best, run=run, checkpoint=run.checkpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.95)
    parser.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "lumos_demo"))
    args = parser.parse_args(argv)

    import ray

    start = time.monotonic()
    ray.init(num_cpus=NUM_CPUS, include_dashboard=False)
    try:
        name = f"digits-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        outcome = run_sweep(
            num_samples=args.num_samples,
            epochs=args.epochs,
            storage_path=args.storage_path,
            name=name,
            seed=args.seed,
        )
    finally:
        ray.shutdown()

    grid, best = outcome.grid, outcome.best
    test_acc = digits.evaluate_checkpoint(outcome.checkpoint)
    _, epoch = digits.load_model(outcome.checkpoint)
    statuses = [r.status for r in grid]
    wall = time.monotonic() - start
    shown = {k: v for k, v in best.config.items() if k in ("lr", "width", "batch_size")}
    print()
    print(
        f"trials: {len(grid)} ({statuses.count('TERMINATED')} completed, "
        f"{statuses.count('PRUNED')} pruned, {grid.num_errors} errors)"
    )
    print(f"best config: {shown}  (trial {best.trial_name})")
    print(f"validation accuracy: {best.metrics['val_accuracy']:.4f} after {epoch} epochs")
    print(f"TEST accuracy: {test_acc:.4f}  (held-out split, never seen by tuning)")
    print(f"checkpoint: {outcome.checkpoint.path}")
    print(f"wall time: {wall:.1f} s")
    if test_acc < args.min_accuracy:
        print(f"FAILED: test accuracy {test_acc:.4f} < {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
