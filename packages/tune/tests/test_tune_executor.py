"""PoolExecutor over the runtime's in-process FakeWorkerPool: reuse, waiting, cancellation."""

from __future__ import annotations

import json
import threading
from typing import Any

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage import RunStorage
from lumos.tune._internal.executor import Cancelled, Failed, Finished, PoolExecutor, Reported
from lumos.tune._internal.session import TrialRunner
from lumos.tune._internal.trial_spec import SweepInfo, TrialSpec


def spec(n: int) -> TrialSpec:
    return TrialSpec(trial_id=f"{n:05d}", trial_name=f"trial_{n:05d}", config={"n": n})


def runner(trainable: Any, tmp_path: Any) -> TrialRunner:
    return TrialRunner(trainable, SweepInfo(RunStorage(str(tmp_path), "exp")))


def drain(ex: PoolExecutor, until: int) -> list[Any]:
    events: list[Any] = []
    for _ in range(600):  # bounded: 30 s
        events += ex.poll(0.05)
        if sum(isinstance(e, (Finished, Failed)) for e in events) >= until:
            return events
    raise AssertionError(f"only {events}")


def test_trials_reuse_workers_and_a_waiting_trial_takes_the_first_free_one(tmp_path: Any) -> None:
    gate = threading.Event()

    def trainable(config: dict[str, Any]) -> None:
        if config["n"] == 0:
            gate.wait(10)
        tune.report({"loss": float(config["n"])})

    pool = FakeWorkerPool({"CPU": 1.0}, capacity=1)
    ex = PoolExecutor(pool, runner(trainable, tmp_path))
    ex.start(spec(0))
    ex.start(spec(1))  # the pool has room for one worker: this one waits
    assert ex.waiting_for_resources() == ["00001"]
    assert [launch["worker_id"] for launch in pool.launches] == [0]
    gate.set()
    events = drain(ex, until=2)
    assert [type(e) for e in events if not isinstance(e, Reported)] == [Finished, Finished]
    # trial 1 ran on worker 0 once it was free; worker 1 (never placed) is a spare
    assert [launch["worker_id"] for launch in pool.launches] == [0, 0]
    ex.start(spec(2))
    drain(ex, until=1)
    assert [launch["worker_id"] for launch in pool.launches] == [0, 0, 0]
    assert len(pool.worker_ids) == 2  # no new actor for trial 2
    ex.release_idle(keep=0)
    assert pool.worker_ids == []
    ex.shutdown(grace_period_s=0)


def test_stopping_a_trial_that_never_ran_cancels_it(tmp_path: Any) -> None:
    gate = threading.Event()
    pool = FakeWorkerPool({"CPU": 1.0}, capacity=1)
    ex = PoolExecutor(pool, runner(lambda c: gate.wait(10), tmp_path))
    ex.start(spec(0))
    ex.start(spec(1))
    assert ex.stop("00001") == [Cancelled("00001")]
    assert ex.waiting_for_resources() == []
    gate.set()
    ex.shutdown(grace_period_s=1)


def test_waiting_is_not_reported_while_the_cluster_has_room(tmp_path: Any) -> None:
    pool = FakeWorkerPool({"CPU": 1.0}, capacity=0)
    ex = PoolExecutor(
        pool,
        runner(lambda c: None, tmp_path),
        available_resources=lambda: {"CPU": 2.0},
        resources={"CPU": 1.0},
    )
    ex.start(spec(0))
    assert ex.waiting_for_resources() == []  # placement in progress, not a lack of resources
    ex.available_resources = lambda: {"CPU": 0.5}
    assert ex.waiting_for_resources() == ["00000"]
    ex.shutdown(grace_period_s=0)


def test_user_errors_carry_the_remote_traceback(tmp_path: Any) -> None:
    def trainable(config: dict[str, Any]) -> None:
        raise KeyError("missing-key")

    ex = PoolExecutor(FakeWorkerPool({"CPU": 1.0}), runner(trainable, tmp_path))
    ex.start(spec(0))
    (event,) = drain(ex, until=1)
    assert isinstance(event, Failed)
    assert not event.worker_lost
    assert event.error.exc_type == "KeyError"
    assert "missing-key" in event.error.traceback
    assert "trainable" in event.error.traceback
    ex.shutdown(grace_period_s=0)


def test_an_optuna_trial_pruned_raised_by_the_user_ends_the_trial_pruned(tmp_path: Any) -> None:
    import optuna

    def trainable(config: dict[str, Any]) -> None:
        tune.report({"loss": 1.0})
        raise optuna.TrialPruned("the user's own pruning")

    pool = FakeWorkerPool({"CPU": 1.0}, capacity=1)
    ex = PoolExecutor(pool, runner(trainable, tmp_path))
    ex.start(spec(0))
    events = drain(ex, until=1)
    assert [e for e in events if isinstance(e, Finished)] == [
        Finished("00000", pruned=True, message="the user's own pruning")
    ]
    ex.shutdown(grace_period_s=0)


def test_the_trial_side_does_not_import_optuna() -> None:
    # A fresh trial actor unpickles TrialRunner and runs tune.report: neither needs
    # optuna (about 0.1 s of CPU per actor), until a trial is pruned.
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from lumos import tune\n"
        "from lumos.tune._internal.session import TrialRunner\n"
        "api = callable(tune.report) and callable(tune.get_checkpoint)\n"
        "before = 'optuna' in sys.modules\n"
        "tune.TrialPruned\n"
        "print(json.dumps([api, before, 'optuna' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    ).stdout
    api, optuna_before, optuna_after = json.loads(out.strip().splitlines()[-1])
    assert api
    assert not optuna_before, "optuna was imported"
    assert optuna_after
