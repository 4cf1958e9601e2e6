"""Checks shared by the integration tests (driver side; no Ray needed to import)."""

from __future__ import annotations

from typing import Any

from lumos.storage import RunStorage

#: Name of the Train run that a trainer started inside a Tune trial uses by default.
NESTED_RUN = "train"


def trial_dirs(experiment: RunStorage) -> list[str]:
    """Names of the experiment's trial directories."""
    names = []
    for entry in experiment.fs.ls(experiment.run_path, detail=True):
        base = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        if entry.get("type") == "directory" and base.startswith("trial_"):
            names.append(base)
    return sorted(names)


def nested_run(experiment: RunStorage, trial: str) -> RunStorage:
    """The Train run inside a trial's directory."""
    return experiment.child(trial).child(NESTED_RUN)


def nested_runs(storage_path: str, name: str, filesystem: Any = None) -> dict[str, RunStorage]:
    """The Train runs of a Tune-over-Train experiment by trial name (trials without one left out)."""
    experiment = RunStorage(storage_path, name, filesystem)
    runs: dict[str, RunStorage] = {}
    for trial in trial_dirs(experiment):
        run = nested_run(experiment, trial)
        if run.load_state() is not None:
            runs[trial] = run
    return runs


def assert_no_uncommitted(storage_path: str, name: str, filesystem: Any = None) -> None:
    """No unfinished upload anywhere in a Tune-over-Train experiment.

    Checks the experiment (trial directories are its own), every trial (its nested
    Train run is its own) and every nested Train run (``RunStorage.list_uncommitted``),
    and reports every leftover at once.
    """
    experiment = RunStorage(storage_path, name, filesystem)
    trials = trial_dirs(experiment)
    assert trials, f"no trial directories in {experiment.uri}"
    leftovers = [f"{experiment.uri}/{d}" for d in experiment.list_uncommitted(reserved=trials)]
    for trial in trials:
        trial_storage = experiment.child(trial)
        leftovers += [
            f"{trial_storage.uri}/{d}"
            for d in trial_storage.list_uncommitted(reserved=[NESTED_RUN])
        ]
        run = trial_storage.child(NESTED_RUN)
        if run.load_state() is not None:
            leftovers += [f"{run.uri}/{d}" for d in run.list_uncommitted()]
    assert leftovers == [], f"uncommitted (unfinished) uploads left behind: {leftovers}"


def sweep_good_and_bad(
    trial: Any,
    name: str,
    storage_dir: str,
    *,
    key: str,
    good: Any,
    bad: Any,
    metric: str,
    upper: float,
    constants: dict[str, Any] | None = None,
    run_config: dict[str, Any] | None = None,
) -> tuple[Any, Any, Any]:
    """Run two Tune-over-Train trials at once, ``key=good`` and ``key=bad``, under a
    ``ThresholdPruner(upper)`` on ``metric`` (min): the good one must end TERMINATED
    and the bad one PRUNED (not errored). Returns ``(grid, good_result, bad_result)``.
    """
    import optuna

    from lumos import tune

    constants = constants or {}
    grid = tune.Tuner(
        trial,
        param_space={key: tune.choice([good, bad]), **constants},
        tune_config=tune.TuneConfig(
            metric=metric,
            mode="min",
            num_samples=2,
            max_concurrent_trials=2,
            trial_resources={"CPU": 0},
            points_to_evaluate=[{key: good, **constants}, {key: bad, **constants}],
            pruner=optuna.pruners.ThresholdPruner(upper=upper),
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=storage_dir, verbose=0, **(run_config or {})
        ),
    ).fit()
    by_value = {r.config[key]: r for r in grid}
    good_result, bad_result = by_value[good], by_value[bad]
    assert good_result.status == "TERMINATED", good_result.error
    assert bad_result.status == "PRUNED", bad_result.error
    assert grid.num_errors == 0
    return grid, good_result, bad_result


def assert_pruned_run_stopped(
    storage_dir: str, name: str, good: Any, bad: Any
) -> tuple[RunStorage, RunStorage]:
    """The bad trial's Train run was stopped by its trial (``aborted``), the good one's
    ``finished``, and no unfinished upload is left. Returns ``(good_run, bad_run)``."""
    experiment = RunStorage(storage_dir, name)
    bad_run = nested_run(experiment, bad.trial_name)
    state = bad_run.load_state()
    assert state is not None
    assert state.status == "aborted"  # stopped by its trial: not finished, not errored
    good_run = nested_run(experiment, good.trial_name)
    good_state = good_run.load_state()
    assert good_state is not None
    assert good_state.status == "finished"
    assert_no_uncommitted(storage_dir, name)
    return good_run, bad_run
