"""The `lumos` command on real sweeps (Tuner.fit in-process with runtime's FakeWorkerPool).

`lumos ls`, `lumos show <sweep>` (table and --json), `lumos dashboard` (the study file it
builds, and optuna-dashboard really serving it on 127.0.0.1), locally and on S3 (moto).
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from ray import cloudpickle
from typer.testing import CliRunner

from lumos import tune
from lumos.runtime.testing import FakeWorkerPool
from lumos.storage.cli import app
from lumos.storage.testing import DUMMY_KEY, DUMMY_SECRET, REGION, S3Server, s3_server

cloudpickle.register_pickle_by_value(sys.modules[__name__])

XS = [0.1, 0.5, 0.9, 2.0]


def objective(config: dict[str, Any]) -> None:
    """0.1 and 0.5 finish, 0.9 is pruned at its first report (ThresholdPruner), 2.0 raises."""
    if config["x"] > 1.5:
        raise ValueError(f"x={config['x']} is out of range")
    for step in range(3):
        tune.report({"loss": config["x"] + 0.1 * step})


def run_sweep(storage_path: str, name: str = "sweep-7", **run_kw: Any) -> tune.ResultGrid:
    return tune.Tuner(
        objective,
        param_space={"x": tune.grid_search(XS)},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            max_concurrent_trials=2,
            pruner=optuna.pruners.ThresholdPruner(upper=0.8),
        ),
        run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=0, **run_kw),
        _pool_factory=lambda r: FakeWorkerPool(r),
    ).fit()


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweeps")
    grid = run_sweep(str(root))
    assert sorted(r.status for r in grid) == ["ERROR", "PRUNED", "TERMINATED", "TERMINATED"]
    return root


def test_ls_shows_the_sweep_with_its_best_trial(sweep: Path) -> None:
    rows = json.loads(invoke("ls", str(sweep), "--json").stdout)
    assert len(rows) == 1
    row = rows[0]
    assert (row["name"], row["kind"], row["status"], row["trials"]) == (
        "sweep-7",
        "sweep",
        "finished",
        4,
    )
    assert row["counts"] == {"TERMINATED": 2, "PRUNED": 1, "ERROR": 1}
    assert row["best"]["metric"] == "loss"
    assert row["best"]["mode"] == "min"
    assert row["best"]["value"] == pytest.approx(0.3)
    assert row["best"]["trial"] == "trial_00000"
    assert row["started_at"].endswith("Z")

    by_max = json.loads(invoke("ls", str(sweep), "--json", "--mode", "max").stdout)[0]
    assert by_max["best"]["value"] == pytest.approx(0.7)

    text = invoke("ls", str(sweep)).stdout
    assert "sweep-7" in text
    assert "sweep" in text
    assert "loss=0.3 (min, trial_00000)" in text


def test_show_sweep_json_has_trials_best_and_counts(sweep: Path) -> None:
    result = invoke("show", str(sweep / "sweep-7"), "--json")
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert detail["kind"] == "sweep"
    assert (detail["metric"], detail["mode"]) == (["loss"], ["min"])
    assert (detail["num_trials"], detail["num_pruned"], detail["num_errors"]) == (4, 1, 1)
    trials = {t["config"]["x"]: t for t in detail["trials"]}
    assert sorted(trials) == XS
    assert trials[0.1]["status"] == "TERMINATED"
    assert trials[0.1]["iteration"] == 3
    assert trials[0.9]["status"] == "PRUNED"
    assert trials[0.9]["iteration"] >= 1
    assert trials[2.0]["status"] == "ERROR"
    assert trials[2.0]["error"]["type"] == "ValueError"
    assert "x=2.0 is out of range" in trials[2.0]["error"]["message"]
    assert detail["best_trial"]["name"] == trials[0.1]["name"]
    assert detail["best_trial"]["last_result"]["loss"] == pytest.approx(0.3)


def test_show_sweep_prints_the_live_table(sweep: Path) -> None:
    result = invoke("show", str(sweep / "sweep-7"))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "sweep-7 (finished): 4 trials: 1 ERROR, 1 PRUNED, 2 TERMINATED" in out
    assert "best trial_00000 loss=0.3" in out
    for header in ("trial", "status", "x", "iter", "loss"):
        assert header in out
    assert "1 pruned, 1 errored" in out
    assert "ValueError: x=2.0 is out of range" in out


def test_a_trial_without_checkpoints_is_not_a_run(sweep: Path) -> None:
    """A trial's directory holds a run state only once it commits a checkpoint."""
    detail = json.loads(invoke("show", str(sweep / "sweep-7"), "--json").stdout)
    trial_dir = detail["trials"][0]["path"]
    result = invoke("show", trial_dir)
    assert result.exit_code == 2
    assert f"{trial_dir!r} is not a lumos run or sweep" in result.stderr


def test_dashboard_print_command_builds_a_journal_optuna_reads(sweep: Path, tmp_path: Path) -> None:
    target = tmp_path / "copy.journal"
    result = invoke(
        "dashboard",
        str(sweep / "sweep-7"),
        "--journal-file",
        str(target),
        "--port",
        "8123",
        "--print-command",
    )
    assert result.exit_code == 0, result.output
    assert shlex.split(result.stdout.strip()) == [
        "optuna-dashboard",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
    ]
    study = optuna.load_study(
        study_name="sweep-7", storage=JournalStorage(JournalFileBackend(str(target)))
    )
    assert len(study.trials) == 4
    assert study.best_trial.params == {"x": 0.1}


def test_dashboard_of_a_train_run_or_a_bad_port_exits_2(sweep: Path, tmp_path: Path) -> None:
    from lumos.storage import RunState, RunStorage

    RunStorage(str(tmp_path), "run-1").save_state(RunState(name="run-1"))
    result = invoke("dashboard", str(tmp_path / "run-1"), "--print-command")
    assert result.exit_code == 2
    assert "is a Train run" in result.stderr
    result = invoke("dashboard", str(sweep / "sweep-7"), "--port", "0")
    assert result.exit_code == 2
    assert "--port=0" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dashboard_serves_the_study_on_loopback(sweep: Path) -> None:
    pytest.importorskip("optuna_dashboard")  # the [dashboard] extra, in the test extra too
    script = Path(sys.executable).with_name("lumos")
    assert script.exists(), "reinstall lumos-storage: pip install -e packages/storage"
    port = _free_port()
    proc = subprocess.Popen(
        [str(script), "dashboard", str(sweep / "sweep-7"), "--port", str(port), "--optuna"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        body = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    body = json.loads(r.read())
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        assert body is not None, f"optuna-dashboard did not answer (exit {proc.poll()})"
        names = [s["study_name"] for s in body["study_summaries"]]
        assert names == ["sweep-7"]
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert f"on http://127.0.0.1:{port}/" in out


# -- S3 (moto server on 127.0.0.1): the study journal is kept in chunks there ---------------


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def test_sweep_on_s3_ls_show_and_dashboard_file(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3.create_bucket()
    run_sweep(f"s3://{bucket}/sweeps", storage_filesystem=s3.filesystem())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    url = f"s3://{bucket}/sweeps"
    endpoint = ("--endpoint-url", s3.endpoint_url)
    rows = json.loads(invoke("ls", url, *endpoint, "--json").stdout)
    assert [(r["name"], r["kind"], r["trials"]) for r in rows] == [("sweep-7", "sweep", 4)]
    detail = json.loads(invoke("show", f"{url}/sweep-7", *endpoint, "--json").stdout)
    assert (detail["num_pruned"], detail["num_errors"]) == (1, 1)
    target = tmp_path / "s3.journal"
    result = invoke(
        "dashboard", f"{url}/sweep-7", *endpoint, "--journal-file", str(target), "--print-command"
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(
        study_name="sweep-7", storage=JournalStorage(JournalFileBackend(str(target)))
    )
    assert sorted(t.params["x"] for t in study.trials) == XS


def test_a_sweep_state_without_a_study_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    from lumos.storage import RunState, RunStorage

    storage = RunStorage(str(tmp_path), "half")
    storage.save_state(RunState(name="half", extra={"tune": {"metric": "loss", "mode": "min"}}))
    result = invoke("show", storage.uri)
    assert result.exit_code == 1
    assert "cannot read the sweep" in result.stderr
    (row,) = json.loads(invoke("ls", str(tmp_path), "--json").stdout)
    assert row["status"] == "unreadable"
