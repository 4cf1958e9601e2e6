"""A sweep whose driver is SIGKILLed at any phase, then run again: the same
``ResultGrid`` as the sweep never interrupted (each trial's config, metrics, checkpoint
and metrics history), and no trial that ended runs again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_tune_ray import _ended_trials

from lumos.runtime.testing import wait_until_process_gone

DRIVER = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    import ray
    from lumos import tune

    address, storage, gate, hold = sys.argv[1:5]
    ray.init(address=address, log_to_driver=False)

    def trainable(config):
        start = 0
        ckpt = tune.get_checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                start = int(open(os.path.join(d, "step")).read())
        for step in range(start + 1, 5):
            with open(os.path.join(storage, "marks"), "a") as f:
                f.write(f"{config['x']}:{step}\\n")
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "step"), "w").write(str(step))
                tune.report({"loss": config["x"] * step, "step": step},
                            checkpoint=tune.Checkpoint.from_directory(d))
            if hold == "running" and config["x"] == 3 and step == 2:
                with open(gate + ".holding", "w") as f:  # step 2's report returned
                    f.write(str(os.getpid()))
                while os.path.exists(gate):
                    time.sleep(0.05)

    class HoldAtTheEnd(tune.Callback):
        ended = 0
        def on_trial_complete(self, iteration, trials, trial, **info):
            HoldAtTheEnd.ended += 1
            if hold == "ended" and HoldAtTheEnd.ended == 4:
                open(gate + ".held", "w").close()
                while os.path.exists(gate):
                    time.sleep(0.05)

    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([0, 1, 2, 3])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
        run_config=tune.RunConfig(name="phases", storage_path=storage, verbose=0,
                                  callbacks=[HoldAtTheEnd()]),
    ).fit()
    summary = []
    for r in sorted(grid, key=lambda r: r.config["x"]):
        frame = r.metrics_dataframe[["training_iteration", "step", "loss"]]
        summary.append([r.config, r.metrics, os.path.basename(r.checkpoint.path),
                        frame.to_dict("records"), r.error is None])
    print("SUMMARY " + json.dumps(summary))
    """
)


def _summary(out: str) -> Any:
    line = next(x for x in out.splitlines() if x.startswith("SUMMARY "))
    return json.loads(line[len("SUMMARY ") :])


def _driver(root: Path, address: str, hold: str, **popen: Any) -> Any:
    script = root / "driver.py"
    script.write_text(DRIVER)
    cmd = [sys.executable, str(script), address, str(root), str(root / "gate"), hold]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.Popen(cmd, env=env, text=True, **popen)


def _finish(proc: Any) -> Any:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return _summary(out)


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster: Any, tmp_path_factory: Any) -> Any:
    root = Path(tmp_path_factory.mktemp("uninterrupted"))
    address = ray_cluster.address_info["address"]
    return _finish(_driver(root, address, "none", stdout=subprocess.PIPE, stderr=subprocess.STDOUT))


@pytest.mark.parametrize("phase", ["running", "ended", "finished"])
def test_a_resumed_sweep_returns_the_uninterrupted_result_grid(
    ray_cluster: Any, uninterrupted: Any, tmp_path: Path, phase: str
) -> None:
    address = ray_cluster.address_info["address"]
    gate = tmp_path / "gate"
    journal = tmp_path / "phases" / "_lumos" / "trials.journal"
    if phase == "finished":
        assert _finish(_driver(tmp_path, address, phase, stdout=subprocess.PIPE)) == uninterrupted
    else:
        gate.touch()
        proc = _driver(tmp_path, address, phase, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        try:
            while True:
                assert proc.poll() is None, "the driver ended before the phase"
                assert time.monotonic() < deadline, f"the sweep never reached {phase}"
                ended = _ended_trials(str(journal)) if journal.exists() else set()
                # the other trials ended and the held one's report of step 2 returned
                # (on a loaded machine the held trial may start after the others end)
                holding = Path(f"{gate}.holding").exists()
                if phase == "running" and len(ended) == 3 and holding:
                    break
                if phase == "ended" and Path(f"{gate}.held").exists():
                    break
                time.sleep(0.1)  # watching another process's files
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        if phase == "running":
            # Ray kills a dead driver's actors soon, not at once: the held trial of the
            # killed sweep must not see the gate open and report step 3 once more.
            wait_until_process_gone(int(Path(f"{gate}.holding").read_text()), timeout_s=120)
        gate.unlink()
    marks_before = (tmp_path / "marks").read_text().splitlines()
    rerun = _driver(tmp_path, address, phase, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert _finish(rerun) == uninterrupted
    marks = (tmp_path / "marks").read_text().splitlines()
    again = marks[len(marks_before) :]
    if phase == "running":  # only the held trial goes on, from its checkpoint
        assert again == ["3:3", "3:4"]
    else:
        assert again == []  # every trial had ended: none runs again
