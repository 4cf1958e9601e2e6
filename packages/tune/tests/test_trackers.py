"""MLflow and W&B loggers on a real sweep (local Ray): one tracker run per trial with its
config, its metrics by step and its end status. MLflow writes to a real sqlite tracking
store; W&B runs offline, and the test reads its transaction logs back."""

from __future__ import annotations

import glob
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from ray import cloudpickle

from lumos import tune
from lumos.tune.logger import MLflowLoggerCallback, WandbLoggerCallback

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def curve(config: dict[str, Any]) -> None:
    from lumos.runtime import context

    job = context.current()
    assert job is not None
    for step in range(3):
        if config["x"] < 0 and step == 1:
            raise ValueError("negative x")
        metrics = {"loss": config["x"] ** 2 + 1.0 / (step + 1), "tag": "text", "ok": True}
        with tempfile.TemporaryDirectory() as d:
            Path(d, "weights.txt").write_text(str(step))
            ckpt = tune.Checkpoint.from_directory(d) if step == 2 else None
            tune.report(metrics, checkpoint=ckpt)
        job.stop_event.wait(0.5)  # a pruned trial stops waiting at once


class PruneLarge(optuna.pruners.BasePruner):
    """Prunes a trial whose latest loss is above 50 (x = 9), nothing else."""

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        values = trial.intermediate_values
        return bool(values) and values[max(values)] > 50


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B in offline mode writing under tmp_path; no network, no error reports."""
    root = tmp_path / "wandb-dir"
    root.mkdir()
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_PROJECT": "lumos-tests",
    }.items():
        monkeypatch.setenv(key, value)
    yield root
    import wandb

    wandb.teardown()


def wandb_records(run_file: str) -> Iterator[Any]:
    """The records of an offline run's ``.wandb`` file (a LevelDB-style log of 32 KiB
    blocks: 7-byte file header, then records with a ``crc, length, type`` header; a
    record may span blocks as FIRST/MIDDLE/LAST parts)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B"
    pos, part = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(part)
            part = b""
            yield record


def wandb_runs(root: Path) -> dict[str, dict[str, Any]]:
    """display name -> group, config, history rows and exit code, of every offline run."""
    import json

    runs: dict[str, dict[str, Any]] = {}
    for run_file in glob.glob(str(root / "wandb" / "offline-run-*" / "run-*.wandb")):
        run: dict[str, Any] = {"history": [], "exit_code": None, "summary": {}, "artifacts": []}
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["name"] = record.run.display_name
                run["group"] = record.run.run_group
                run["config"] = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            elif kind == "history":
                run["history"].append(
                    {
                        i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json)
                        for i in record.history.item
                    }
                )
            elif kind == "summary":
                for item in record.summary.update:
                    run["summary"][item.nested_key[0] if item.nested_key else item.key] = (
                        json.loads(item.value_json)
                    )
            elif kind == "artifact":
                paths = sorted(e.path for e in record.artifact.manifest.contents)
                run["artifacts"].append((record.artifact.name, paths))
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
        runs[run["name"]] = run
    return runs


def test_one_tracker_run_per_trial_with_params_metrics_and_status(
    ray_cluster: Any, tmp_path: Path, wandb_offline: Path
) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    grid = tune.Tuner(
        curve,
        param_space={"x": tune.grid_search([1.0, 9.0, -1.0]), "model": {"width": 4}},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=1, pruner=PruneLarge()
        ),
        run_config=tune.RunConfig(
            name="sweep",
            storage_path=str(tmp_path / "results"),
            verbose=0,
            callbacks=[
                MLflowLoggerCallback(uri, tags={"team": "a"}),
                WandbLoggerCallback(upload_checkpoints=True),
            ],
        ),
    ).fit()
    status = {r.config["x"]: r.status for r in grid}
    assert status == {1.0: "TERMINATED", 9.0: "PRUNED", -1.0: "ERROR"}
    name_of = {r.config["x"]: r.path.rstrip("/").rsplit("/", 1)[-1] for r in grid}

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweep")  # the Tune experiment's name
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == sorted(name_of.values())
    # reports: how many results the trial made (a pruned one: 1, or 2 when the pruner's
    # answer came after its next report)
    reports = {r.config["x"]: r.metrics["training_iteration"] for r in grid}
    assert reports[1.0] == 3
    assert reports[-1.0] == 1
    expected = {1.0: ("FINISHED", "TERMINATED"), 9.0: ("FINISHED", "PRUNED"),
                -1.0: ("FAILED", "ERROR")}  # fmt: skip
    for x, (mlflow_status, trial_status) in expected.items():
        run = runs[name_of[x]]
        assert run.info.status == mlflow_status
        assert run.data.tags["trial_status"] == trial_status
        assert run.data.tags["team"] == "a"
        assert run.data.params == {"x": str(x), "model/width": "4"}
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [(m.step, m.value) for m in history] == [
            (s + 1, x**2 + 1.0 / (s + 1)) for s in range(reports[x])
        ]
        assert "tag" not in run.data.metrics
        assert "ok" not in run.data.metrics

    import wandb

    wandb.teardown()  # run.finish() leaves offline records buffered; this writes them
    wb = wandb_runs(wandb_offline)
    assert sorted(wb) == sorted(name_of.values())
    for x, (_, trial_status) in expected.items():
        run = wb[name_of[x]]
        assert run["group"] == "sweep"
        assert run["config"]["x"] == x
        assert run["config"]["model/width"] == 4
        assert [(h["_step"], h["loss"]) for h in run["history"]] == [
            (s + 1, x**2 + 1.0 / (s + 1)) for s in range(reports[x])
        ]
        assert all("tag" not in h and "done" not in h for h in run["history"])
        assert run["exit_code"] == (1 if trial_status == "ERROR" else 0)
        assert run["summary"]["trial_status"] == trial_status
        # upload_checkpoints: the one checkpoint (x = 1's last report) as an artifact
        kept = [(f"checkpoint_{name_of[x]}", ["weights.txt"])] if x == 1.0 else []
        assert run["artifacts"] == kept


def test_a_missing_project_or_extra_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with pytest.raises(ValueError, match="WANDB_PROJECT"):
        WandbLoggerCallback().setup(str(tmp_path / "exp"), None)  # type: ignore[arg-type]
    # without the extra: a clean interpreter where importing mlflow / wandb fails
    code = (
        "import sys; sys.modules['mlflow'] = None; sys.modules['wandb'] = None\n"
        "from lumos.tune.logger import MLflowLoggerCallback\n"
        "for mod in ('lumos.tune.integrations.mlflow', 'lumos.tune.integrations.wandb'):\n"
        "    try:\n"
        "        __import__(mod)\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
        "try:\n"
        "    MLflowLoggerCallback()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == [
        "mlflow is not installed: pip install 'lumos-tune[mlflow]' (or pip install mlflow)",
        "wandb is not installed: pip install 'lumos-tune[wandb]' (or pip install wandb)",
        "mlflow is not installed: pip install 'lumos-tune[mlflow]' (or pip install mlflow)",
    ]
