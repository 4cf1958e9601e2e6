"""MLflow and W&B for Train: the driver-side callbacks on a 2-worker TorchTrainer run (real
Ray) log rank 0's reports by step, the config, the checkpoint paths and the end status;
``setup_mlflow`` / ``setup_wandb`` log from rank 0 only. MLflow writes to a real sqlite
store; W&B runs offline and the test reads its transaction log back."""

from __future__ import annotations

import glob
import json
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config
from ray import cloudpickle

from lumos import train
from lumos.train.integrations.mlflow import MLflowLoggerCallback, setup_mlflow
from lumos.train.integrations.wandb import WandbLoggerCallback, setup_wandb
from lumos.train.torch import TorchTrainer

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("no_leaks")


def three_reports(config: dict[str, Any]) -> None:
    rank = train.get_context().get_world_rank()
    mlflow = setup_mlflow(config, tracking_uri=config["uri"], run_name="inside")
    run = setup_wandb(config, project="lumos-tests", dir=config["wandb_dir"], mode="offline")
    for step in range(3):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "w.txt").write_text(str(step))
            ckpt = train.Checkpoint.from_directory(d) if step > 0 else None
            loss = 1.0 / (step + 1) + rank  # rank 1's values must not show up
            train.report({"loss": loss, "phase": "fit", "nested": {"acc": step / 4}}, ckpt)
        mlflow.log_metric("inside_loss", loss, step=step)
        run.log({"inside_loss": loss})
    mlflow.end_run()
    run.finish()
    import wandb

    wandb.teardown()  # writes the offline run's buffered records before the worker ends


WANDB_QUIET = {"WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_ERROR_REPORTING": "false"}


@pytest.fixture
def wandb_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B offline under tmp_path: no network, no error reports."""
    root = tmp_path / "wandb-dir"
    root.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(root))
    for key, value in WANDB_QUIET.items():
        monkeypatch.setenv(key, value)
    yield root
    import wandb

    wandb.teardown()


def offline_runs(root: Path) -> list[dict[str, Any]]:
    """Every offline W&B run under ``root``: its name, config, logged rows, summary
    and exit code, read from the ``.wandb`` log (32 KiB blocks of ``crc, length, type``
    framed records, a record split FIRST..LAST across blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    found: list[dict[str, Any]] = []
    for name in glob.glob(str(root / "wandb" / "offline-run-*" / "*.wandb")):
        blob, records, chunk, at = Path(name).read_bytes(), [], b"", 7
        while at + 7 <= len(blob):
            room = 32768 - at % 32768
            size, kind = struct.unpack("<HB", blob[at + 4 : at + 7]) if room >= 7 else (0, -1)
            if kind == 0:
                break
            chunk, at = chunk + blob[at + 7 : at + 7 + size], at + (7 + size if room >= 7 else room)
            if kind in (1, 4):
                records.append(pb.Record.FromString(chunk))
                chunk = b""
        run: dict[str, Any] = {"rows": [], "summary": {}}
        for r in records:
            if r.HasField("run"):
                run["name"] = r.run.display_name
                run["config"] = {u.key: json.loads(u.value_json) for u in r.run.config.update}
            elif r.HasField("history"):
                run["rows"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                    for i in r.history.item})  # fmt: skip
            elif r.HasField("summary"):
                run["summary"].update({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                       for i in r.summary.update})  # fmt: skip
            elif r.HasField("exit"):
                run["exit_code"] = r.exit.exit_code
        found.append(run)
    return sorted(found, key=lambda r: "inside_loss" in r["rows"][0])


def test_two_worker_run_is_logged_once_with_steps_checkpoints_and_status(
    tmp_path: Path, wandb_dir: Path
) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_cb = MLflowLoggerCallback(uri, experiment_name="train-tests", tags={"team": "a"})
    config = {"uri": uri, "wandb_dir": str(wandb_dir), "model": {"width": 8}}
    result = TorchTrainer(
        three_reports,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "tracked",
            callbacks=[mlflow_cb, WandbLoggerCallback(project="lumos-tests")],
            worker_runtime_env={"env_vars": WANDB_QUIET},
        ),
    ).fit()
    assert result.checkpoint is not None
    ckpts = sorted(p.name for p in Path(result.path).iterdir() if p.name.startswith("checkpoint"))
    assert len(ckpts) == 2

    client = MlflowClient(uri)
    run = client.get_run(mlflow_cb.run_id)
    assert (run.info.run_name, run.info.status) == ("tracked", "FINISHED")
    assert run.data.params == {"uri": uri, "wandb_dir": str(wandb_dir), "model/width": "8"}
    assert run.data.tags["team"] == "a"
    assert run.data.tags["lumos.run_path"] == result.path
    assert run.data.tags["checkpoint"] == result.checkpoint.uri
    assert {k for k in run.data.tags if k.startswith("checkpoint/")} == {
        f"checkpoint/{c}" for c in ckpts
    }
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "nested/acc")] == [
        0.0,
        0.25,
        0.5,
    ]
    assert "phase" not in run.data.metrics
    # setup_mlflow: one run, from rank 0
    inside = client.search_runs(
        [run.info.experiment_id, "0"], filter_string="attributes.run_name = 'inside'"
    )
    assert len(inside) == 1
    history = client.get_metric_history(inside[0].info.run_id, "inside_loss")
    assert [m.value for m in history] == [1.0, 0.5, 1 / 3]

    # the callback's run, then rank 0's setup_wandb run (none from rank 1)
    import wandb

    wandb.teardown()  # run.finish() leaves offline records buffered; this writes them
    logged, inside_wb = offline_runs(wandb_dir)
    assert logged["name"] == inside_wb["name"] == "tracked"
    assert logged["config"]["model/width"] == 8
    assert inside_wb["config"]["model"] == {"width": 8}
    assert [(r["_step"], r["loss"], r["nested/acc"]) for r in logged["rows"]] == [
        (1, 1.0, 0.0),
        (2, 0.5, 0.25),
        (3, 1 / 3, 0.5),
    ]
    assert logged["summary"]["checkpoint"] == result.checkpoint.uri
    assert logged["exit_code"] == 0
    assert [r["inside_loss"] for r in inside_wb["rows"]] == [1.0, 0.5, 1 / 3]


def test_a_failed_run_ends_failed_and_without_the_extra_import_names_it(
    tmp_path: Path, wandb_dir: Path
) -> None:
    from mlflow import MlflowClient

    def boom() -> None:
        train.report({"loss": 1.0})
        raise RuntimeError("boom")

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_cb = MLflowLoggerCallback(uri)
    wandb_cb = WandbLoggerCallback(project="lumos-tests")
    with pytest.raises(RuntimeError, match="boom"):
        TorchTrainer(
            boom,
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=run_config(tmp_path, "fails", callbacks=[mlflow_cb, wandb_cb]),
        ).fit()
    run = MlflowClient(uri).get_run(mlflow_cb.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == "RuntimeError: boom"
    assert run.data.metrics == {"loss": 1.0}
    import wandb

    wandb.teardown()
    (wb,) = offline_runs(wandb_dir)
    assert wb["exit_code"] == 1
    assert wb["summary"]["error"] == "RuntimeError: boom"
    assert [row["loss"] for row in wb["rows"]] == [1.0]

    for tracker in ("mlflow", "wandb"):  # a clean interpreter where the tracker is missing
        missing = f"import sys; sys.modules[{tracker!r}] = None\n"
        done = subprocess.run(
            [sys.executable, "-c", missing + f"import lumos.train.integrations.{tracker}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1
        assert done.stderr.strip().endswith(
            f"ImportError: lumos.train.integrations.{tracker} needs {tracker}: "
            f"pip install 'lumos-train[{tracker}]'"
        )
