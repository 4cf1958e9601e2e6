"""Population-based training on a real local Ray cluster: exploits on a toy objective whose
best learning rate is known, and a driver SIGKILL + rerun that keeps every exploit."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import optuna
from ray import cloudpickle

from lumos import tune

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 12


def gain(lr: float) -> float:
    """Progress per step: best at lr = 0.1, smaller the further lr is from it (log scale)."""
    return 1.0 / (1.0 + (math.log10(lr) + 1.0) ** 2)


def _passed(gate: str, step: int) -> None:
    """Mark this trial as past ``step``; wait (bounded) until all 4 trials are.

    Lock-step trials make the test deterministic: when a trial's look comes, every other
    trial has reported the step before it at least, so the slowest learner is ranked last.
    """
    name = tune.get_context().get_trial_name()
    open(os.path.join(gate, f"{step:03d}-{name}"), "w").close()
    deadline = time.monotonic() + 120
    while sum(f.startswith(f"{step:03d}-") for f in os.listdir(gate)) < 4:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all trials passed step {step} within 120 s")
        time.sleep(0.02)  # the other trials' files: nothing to wait on


def toy(config: dict[str, Any]) -> None:
    gate = config["gate"]
    x, step = 0.0, 0
    if (ckpt := tune.get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "s.json")) as f:
            x, step = json.load(f)
    for passed in range(step + 1):  # a clone continues from the donor's step
        _passed(gate, passed)
    while step < STEPS:
        step += 1
        x += gain(config["lr"])
        time.sleep(0.2)  # one "training step"
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "s.json"), "w") as f:
                json.dump([x, step], f)
            tune.report(
                {"score": x, "pid": os.getpid(), "lr": config["lr"]},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
        _passed(gate, step)


def _tuner(tmp_path: Any, name: str, scheduler: Any) -> tune.Tuner:
    gate = str(tmp_path / f"gate-{name}")
    os.makedirs(gate)
    return tune.Tuner(
        toy,
        param_space={"lr": tune.loguniform(1e-4, 1e-3), "gate": gate},
        # fixed starting points, 1.2x apart in progress per step at least, so that the
        # slowest learner is last at every look (lock-step: others are at most a step behind)
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            num_samples=4,
            max_concurrent_trials=4,
            sampler=optuna.samplers.RandomSampler(seed=3),
            points_to_evaluate=[{"lr": lr} for lr in (1e-4, 2e-4, 5e-4, 1e-3)],
            scheduler=scheduler,
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
    )


def test_pbt_exploits_on_the_same_actor_and_beats_fifo(ray_cluster: Any, tmp_path: Any) -> None:
    fifo = _tuner(tmp_path, "fifo", None).fit()
    pbt = tune.PopulationBasedTraining(
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)},
        resample_probability=0.0,
        perturbation_factors=(2.0, 3.0),  # every exploit moves lr towards the best, 0.1
        seed=0,
    )
    grid = _tuner(tmp_path, "pbt", pbt).fit()
    assert grid.num_terminated == 4
    exploits = [e for r in grid for e in r.exploits]
    assert exploits, "no trial was exploited"
    # a look waits for the driver's verdict: the clone replaces the looked-at step itself
    assert all(e.step % 2 == 0 for e in exploits), exploits
    # same seed: the population started from the FIFO sweep's configs
    initial = [r.exploits[0].old_config["lr"] if r.exploits else r.config["lr"] for r in grid]
    assert len(set(initial)) == 4
    assert initial == [r.config["lr"] for r in fifo]
    assert grid.get_best_result().metrics["score"] > fifo.get_best_result().metrics["score"]
    for r in grid:
        rows = r.metrics_dataframe
        assert list(rows["training_iteration"]) == list(range(1, len(rows) + 1))
        if r.exploits:
            assert rows["pid"].nunique() == 1  # relaunched on its own actor
            assert r.config == r.exploits[-1].new_config
            last = r.exploits[-1]
            # reports after the clone use the new config (none if the donor had finished)
            assert set(rows[rows["training_iteration"] > last.step]["lr"]) <= {
                last.new_config["lr"]
            }
            for e in r.exploits:
                after = rows[rows["training_iteration"] == e.step + 1]
                first_donor_score = grid[e.donor].metrics_dataframe["score"].iloc[0]
                # the clone resumed from the donor's checkpoint: it carries its progress
                assert (after["score"] > first_donor_score).all()
    df = grid.get_dataframe()
    assert df["num_exploits"].sum() == len(exploits)


DRIVER = textwrap.dedent(
    """
    import json, math, os, sys, tempfile, time
    import optuna, ray
    from lumos import tune

    address, storage = sys.argv[1:3]
    ray.init(address=address, log_to_driver=False)

    def toy(config):
        x, step = 0.0, 0
        if (ckpt := tune.get_checkpoint()) is not None:
            with ckpt.as_directory() as d, open(os.path.join(d, "s.json")) as f:
                x, step = json.load(f)
        while step < 16:
            step += 1
            x += 1.0 / (1.0 + (math.log10(config["lr"]) + 1.0) ** 2)
            time.sleep(0.25)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "s.json"), "w") as f:
                    json.dump([x, step], f)
                tune.report({"score": x}, checkpoint=tune.Checkpoint.from_directory(d))

    pbt = tune.PopulationBasedTraining(
        perturbation_interval=2, hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)},
        resample_probability=0.0, perturbation_factors=(2.0, 3.0), seed=0)
    grid = tune.Tuner(
        toy,
        param_space={"lr": tune.loguniform(1e-4, 1e-3)},
        tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=4,
                                    max_concurrent_trials=4, scheduler=pbt,
                                    sampler=optuna.samplers.RandomSampler(seed=3)),
        run_config=tune.RunConfig(name="pbtkill", storage_path=storage, verbose=0),
    ).fit()
    out = {r.trial_name: {"exploits": [[e.donor, e.step, e.new_config] for e in r.exploits],
                          "config": r.config, "status": r.status,
                          "iterations": list(r.metrics_dataframe["training_iteration"])}
           for r in grid}
    print("RESULT", json.dumps(out), flush=True)
    """
)


def _exploits_in(journal: str) -> list[dict[str, Any]]:
    try:
        with open(journal) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return [r for r in lines if r.get("e") == "pbt"]


def test_driver_sigkill_then_rerun_keeps_every_exploit(ray_cluster: Any, tmp_path: Any) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    storage = tmp_path / "results"
    address = ray_cluster.address_info["address"]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, str(script), address, str(storage)]
    journal = str(storage / "pbtkill" / "_lumos" / "trials.journal")

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    try:
        while not _exploits_in(journal):
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "no exploit happened"
            time.sleep(0.1)  # watching another process's file: nothing to wait on
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    before = _exploits_in(journal)
    assert before

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    line = next(x for x in rerun.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert all(t["status"] == "TERMINATED" for t in result.values())
    for rec in before:
        trial = result[f"trial_{rec['n']:05d}"]
        assert [rec["d"], rec["i"], rec["new"]] in trial["exploits"], (rec, trial)
    for trial in result.values():
        assert trial["iterations"] == list(range(1, len(trial["iterations"]) + 1))
        if trial["exploits"]:
            assert trial["config"] == trial["exploits"][-1][2]
    # the journal still holds every exploit, once each
    after = _exploits_in(journal)
    keys = [(r["n"], r["i"]) for r in after]
    assert len(keys) == len(set(keys))
    assert all((r["n"], r["i"]) in keys for r in before)
