"""The `lumos` command on runs written with lumos-storage's own API: local disk and S3 (moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsspec import AbstractFileSystem
from typer.testing import CliRunner

from lumos.storage import AttemptRecord, CheckpointRecord, RunState, RunStorage
from lumos.storage.cli import (
    EXIT_USAGE,
    PluginMissingError,
    StoredRun,
    app,
    open_run,
    plugin_for,
)
from lumos.storage.testing import DUMMY_KEY, DUMMY_SECRET, REGION, S3Server

T0 = 1_780_000_000.0  # 2026-05-28T...: fixed times, so the output is known


def make_run(
    storage_path: str,
    name: str,
    tmp_path: Path,
    fs: AbstractFileSystem | None = None,
    *,
    finished: bool = True,
) -> RunStorage:
    """A run with a failed then a finished attempt, and committed, validated and rolled
    back checkpoints, written the way the Train controller writes it."""
    storage = RunStorage(storage_path, name, fs)
    state = RunState(
        name=name,
        created_at=T0,
        attempts=[
            AttemptRecord(
                index=0,
                started_at=T0,
                ended_at=T0 + 5,
                status="errored",
                error="RuntimeError: [/gloo/pair.cc:537] rank 1 died (SIGKILL)",
            ),
            AttemptRecord(index=1, started_at=T0 + 6),
        ],
    )
    storage.save_state(state)
    rows = [{"epoch": i, "loss": 1.0 / (i + 1)} for i in range(4)]  # the step counter first
    storage.append_metrics(rows, 0)
    for i, extra in enumerate(
        [{}, {"validation_status": "validated", "metrics": {"loss": 0.5, "val_loss": 0.6}}, {}]
    ):
        local = tmp_path / f"{name}-ckpt-{i}"
        local.mkdir()
        (local / "model.pt").write_bytes(b"x" * 10)
        dir_name = f"checkpoint_{i}"
        storage.persist_directory(local, dir_name)
        record = CheckpointRecord(
            dir_name=dir_name,
            report_index=i,
            created_at=T0 + 10 + i,
            metrics=extra.get("metrics", {"loss": 1.0 / (i + 1)}),
            validation_status=extra.get("validation_status"),
        )
        state, _ = storage.commit_checkpoint(state, record)
    # A health check rolled back checkpoint_2: the run resumed from checkpoint_1.
    records = [
        r.model_copy(update={"rolled_back": r.dir_name == "checkpoint_2"})
        for r in state.checkpoints
    ]
    state, _ = storage.update_checkpoints(state, records, "checkpoint_1")
    if finished:
        attempts = list(state.attempts)
        attempts[-1] = attempts[-1].model_copy(update={"status": "finished", "ended_at": T0 + 60})
        storage.save_state(state.model_copy(update={"status": "finished", "attempts": attempts}))
    return storage


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_ls_lists_runs_with_state_start_and_best(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(str(root), "run-a", tmp_path)
    make_run(str(root), "run-b", tmp_path, finished=False)
    (root / "not-a-run").mkdir()

    result = invoke("ls", str(root), "--json", "--metric", "loss", "--mode", "min")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == ["run-a", "run-b"]
    a, b = rows
    assert (a["kind"], a["status"], b["status"]) == ("run", "finished", "running")
    assert a["started_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0))
    assert a["best"] == {"metric": "loss", "value": 0.25, "mode": "min", "report": 3}
    assert (a["attempts"], a["reports"], a["checkpoints"]) == (2, 4, 3)
    assert a["path"] == str(root / "run-a")

    table = invoke("ls", str(root))
    assert table.exit_code == 0
    for text in ("run-a", "run-b", "finished", "running", "loss=0.25 (latest, report 3)"):
        assert text in table.stdout, table.stdout


def test_ls_of_one_run_directory_lists_that_run(tmp_path: Path) -> None:
    storage = make_run(str(tmp_path / "runs"), "run-a", tmp_path)
    rows = json.loads(invoke("ls", storage.uri, "--json").stdout)
    assert [r["name"] for r in rows] == ["run-a"]


def test_show_run_attempts_failures_checkpoints_and_metrics(tmp_path: Path) -> None:
    storage = make_run(str(tmp_path / "runs"), "run-a", tmp_path)
    result = invoke("show", storage.uri, "--json")
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert detail["kind"] == "run"
    assert detail["status"] == "finished"
    assert [a["status"] for a in detail["attempts"]] == ["errored", "finished"]
    assert detail["attempts"][0]["duration_s"] == 5.0
    assert [f["error"] for f in detail["failures"]] == [
        "RuntimeError: [/gloo/pair.cc:537] rank 1 died (SIGKILL)"
    ]
    by_name = {c["dir_name"]: c for c in detail["checkpoints"]}
    assert by_name["checkpoint_0"]["status"] == "committed"
    assert by_name["checkpoint_1"]["status"] == "validated"
    assert by_name["checkpoint_1"]["metrics"] == {"loss": 0.5, "val_loss": 0.6}
    assert by_name["checkpoint_1"]["latest"] is True
    assert by_name["checkpoint_2"]["status"] == "rolled back"
    assert detail["latest_metrics"] == {"loss": 0.25, "epoch": 3}
    assert detail["reports"] == 4

    text = invoke("show", storage.uri).stdout
    for part in (
        "run-a",
        "RuntimeError: [/gloo/pair.cc:537] rank 1 died (SIGKILL)",
        "checkpoint_1 (latest)",
        "validated",
        "rolled back",
        "latest metrics (report 3): epoch=3, loss=0.25",
    ):
        assert part in text, text


def test_a_path_that_is_not_a_run_exits_2_naming_the_path(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(str(root), "run-a", tmp_path)
    result = invoke("show", str(root))
    assert result.exit_code == EXIT_USAGE
    assert f"{str(root)!r} is not a lumos run or sweep" in result.stderr
    assert "_lumos/run_state.json" in result.stderr
    assert "it holds runs: run-a" in result.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("show", str(empty))
    assert result.exit_code == EXIT_USAGE
    assert str(empty) in result.stderr

    missing = invoke("ls", str(tmp_path / "nope"))
    assert missing.exit_code == EXIT_USAGE
    assert "does not exist" in missing.stderr

    bad_option = invoke("ls", str(root), "--endpoint-url", "http://127.0.0.1:1")
    assert bad_option.exit_code == EXIT_USAGE
    assert "applies to s3:// paths only" in bad_option.stderr

    bad_mode = invoke("ls", str(root), "--mode", "best")
    assert bad_mode.exit_code == EXIT_USAGE
    assert "--mode='best'" in bad_mode.stderr


def test_a_corrupt_run_is_one_unreadable_row_in_ls_and_an_error_in_show(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(str(root), "good", tmp_path)
    broken = RunStorage(str(root), "broken")
    broken.save_state(RunState(name="broken"))
    Path(broken.state_path).write_text("{not json")
    rows = {r["name"]: r for r in json.loads(invoke("ls", str(root), "--json").stdout)}
    assert rows["good"]["status"] == "finished"
    assert rows["broken"]["status"] == "unreadable"
    assert "not valid JSON" in rows["broken"]["note"]
    result = invoke("show", broken.uri)
    assert result.exit_code == 1
    assert "not valid JSON" in result.stderr


def test_a_sweep_without_its_plugin_says_what_to_install(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path / "sweeps"), "sweep-7")
    storage.save_state(RunState(name="sweep-7", extra={"tune": {"metric": "loss", "mode": "min"}}))
    run = open_run(storage.uri)
    assert run.owner == "tune"
    with pytest.raises(PluginMissingError) as info:
        plugin_for(run, installed={})
    assert str(info.value) == (
        f"{storage.uri!r} is a lumos-tune sweep: pip install lumos-tune to read it"
    )
    assert plugin_for(StoredRun(run.storage, RunState(name="sweep-7")), installed={}) is None


# -- S3 (moto server on 127.0.0.1) ---------------------------------------------------------


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The moto server's dummy credentials in the standard AWS variables."""
    env = {
        "AWS_ACCESS_KEY_ID": DUMMY_KEY,
        "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
        "AWS_DEFAULT_REGION": REGION,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


def test_s3_ls_and_show_with_endpoint_url(
    s3: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    bucket = s3.create_bucket()
    make_run(f"{bucket}/runs", "run-s3", tmp_path, s3.filesystem())
    url = f"s3://{bucket}/runs"
    rows = json.loads(invoke("ls", url, "--endpoint-url", s3.endpoint_url, "--json").stdout)
    assert [(r["name"], r["status"], r["path"]) for r in rows] == [
        ("run-s3", "finished", f"{url}/run-s3")
    ]
    result = invoke("show", f"{url}/run-s3", "--endpoint-url", s3.endpoint_url, "--json")
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)
    assert [c["status"] for c in detail["checkpoints"]] == ["committed", "validated", "rolled back"]
    missing = invoke("show", f"{url}/nope", "--endpoint-url", s3.endpoint_url)
    assert missing.exit_code == EXIT_USAGE
    assert f"{url}/nope" in missing.stderr


def test_s3_endpoint_from_aws_endpoint_url_in_the_installed_script(
    s3: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """The `lumos` console script, as a user runs it: botocore reads AWS_ENDPOINT_URL."""
    bucket = s3.create_bucket()
    make_run(f"{bucket}/runs", "run-env", tmp_path, s3.filesystem())
    script = Path(sys.executable).with_name("lumos")
    assert script.exists(), "reinstall lumos-storage: pip install -e packages/storage"
    env = {**os.environ, **s3_env, "AWS_ENDPOINT_URL": s3.endpoint_url}
    proc = subprocess.run(
        [str(script), "ls", f"s3://{bucket}/runs", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["name"] for r in json.loads(proc.stdout)] == ["run-env"]
