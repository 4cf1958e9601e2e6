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
