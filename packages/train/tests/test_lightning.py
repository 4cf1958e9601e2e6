"""lumos.train.lightning: a real Lightning fit on lumos (Ray, 2 CPU ranks, gloo), resume
after a SIGKILL, local mode, bad input and the missing-extra error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import lightning_fns
import pytest
import torch
from conftest import run_config

from lumos import train
from lumos.train.lightning import (
    CHECKPOINT_NAME,
    LumosDDPStrategy,
    LumosModelParallelStrategy,
    RayDDPStrategy,
    RayTrainReportCallback,
    ReportCallback,
    get_checkpoint_path,
    prepare_trainer,
)
from lumos.train.torch import TorchTrainer

STEPS_PER_EPOCH = lightning_fns.ROWS // lightning_fns.BATCH // 2  # per rank, 2 ranks
# The shared 2-core box runs several Ray clusters at once: a busy worker may answer late.
PATIENT_S = 120.0


@pytest.fixture
def ray_lightning(ray_cluster: str, no_leaks: None) -> None:
    """The session's Ray cluster, with the Lightning functions shipped by value."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(lightning_fns)


def _ckpt(result: train.Result) -> dict[str, Any]:
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        loaded: dict[str, Any] = torch.load(Path(d) / CHECKPOINT_NAME, weights_only=False)
    return loaded


def test_two_worker_fit_reports_metrics_and_checkpoints(
    ray_lightning: None, tmp_path: Path
) -> None:
    result = TorchTrainer(
        lightning_fns.fit,
        train_loop_config={"epochs": 3, "root_dir": str(tmp_path / "pl")},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path, "fit", failure_config=train.FailureConfig(health_check_timeout_s=PATIENT_S)
        ),
    ).fit()

    history = result.metrics_history
    assert [m["epoch"] for m in history] == [0, 1, 2]
    assert [m["step"] for m in history] == [STEPS_PER_EPOCH * (e + 1) for e in range(3)]
    for m in history:  # callback_metrics, as floats
        assert {"train_loss", "val_loss", "score", "start_epoch"} <= set(m)
        assert all(isinstance(m[k], float) for k in ("train_loss", "val_loss", "score"))
    assert history[-1]["val_loss"] < history[0]["val_loss"]  # it learns
    # one checkpoint per epoch; only rank 0 wrote files (DDP), merged into one directory
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1, 2]
    assert result.checkpoint is not None
    assert sorted(p.name for p in Path(result.checkpoint.path).iterdir()) == [CHECKPOINT_NAME]
    ckpt = _ckpt(result)
    assert (ckpt["epoch"], ckpt["global_step"]) == (2, 3 * STEPS_PER_EPOCH)
    assert set(ckpt["state_dict"]) == {"layer.weight", "layer.bias"}


def test_resume_after_a_worker_sigkill_continues_from_the_last_checkpoint(
    ray_lightning: None, tmp_path: Path
) -> None:
    # rank 1 SIGKILLs itself in epoch 2 of attempt 0, after epoch 1's checkpoint committed
    result = TorchTrainer(
        lightning_fns.fit,
        train_loop_config={"epochs": 4, "die": {"rank": 1, "epoch": 2}},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "resume",
            failure_config=train.FailureConfig(max_failures=1, health_check_timeout_s=PATIENT_S),
        ),
    ).fit()

    history = result.metrics_history
    assert [m["epoch"] for m in history] == [0, 1, 2, 3]  # no epoch lost, none repeated
    assert [m["step"] for m in history] == [STEPS_PER_EPOCH * (e + 1) for e in range(4)]
    # attempt 1's Lightning loop started at epoch 2 from epoch 1's checkpoint
    assert [m["start_epoch"] for m in history] == [0.0, 0.0, 2.0, 2.0]
    ckpt = _ckpt(result)
    assert (ckpt["epoch"], ckpt["global_step"]) == (3, 4 * STEPS_PER_EPOCH)


def test_local_mode_every_n_epochs_and_async_upload(tmp_path: Path) -> None:
    env_before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    result = TorchTrainer(
        lightning_fns.fit,
        train_loop_config={
            "epochs": 4,
            "every_n_epochs": 2,
            "upload_mode": train.CheckpointUploadMode.ASYNC,
            "root_dir": str(tmp_path / "pl"),
        },
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=run_config(tmp_path, "local"),
    ).fit()
    steps = lightning_fns.ROWS // lightning_fns.BATCH  # one rank
    assert [(m["epoch"], m["step"]) for m in result.metrics_history] == [
        (1, 2 * steps),
        (3, 4 * steps),
    ]
    assert [m["epoch"] for _, m in result.best_checkpoints] == [1, 3]
    assert _ckpt(result)["epoch"] == 3
    # the one-process group Lightning formed in this process is gone, its env undone
    assert not torch.distributed.is_initialized()
    assert {k: os.environ.get(k) for k in env_before} == env_before


def _files(checkpoint: train.Checkpoint | None) -> list[str]:
    assert checkpoint is not None
    root = Path(checkpoint.path)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.long  # plain nox: test_resume_after_a_worker_sigkill_..., test_fsdp_ray
def test_fsdp2_on_two_ranks_saves_every_ranks_shards_and_resumes_from_them(
    ray_lightning: None, tmp_path: Path
) -> None:
    full = tmp_path / "full.pt"
    first = TorchTrainer(
        lightning_fns.fit_sharded,
        train_loop_config={
            "epochs": 2,
            "full_state_out": str(full),
            "probe_dir": str(tmp_path / "probe"),
        },
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "sharded",
            failure_config=train.FailureConfig(health_check_timeout_s=PATIENT_S),
        ),
    ).fit()
    assert [(m["epoch"], m["step"]) for m in first.metrics_history] == [
        (0, STEPS_PER_EPOCH),
        (1, 2 * STEPS_PER_EPOCH),
    ]
    # both ranks' DCP shards (each from its own folder) in one checkpoint, with rank 0's
    # DCP and Lightning metadata
    shards = [f"{CHECKPOINT_NAME}/{n}" for n in (".metadata", "__0_0.distcp", "__1_0.distcp")]
    assert _files(first.checkpoint) == sorted([*shards, f"{CHECKPOINT_NAME}/meta.pt"])
    # a save into each rank's own folder writes that rank's shard there (Lightning's
    # own strategy would write both into rank 0's folder, which only rank 0's node has)
    probe = tmp_path / "probe"
    assert sorted(p.name for p in (probe / "rank1" / CHECKPOINT_NAME).iterdir()) == ["__1_0.distcp"]
    assert sorted(p.name for p in (probe / "rank0" / CHECKPOINT_NAME).iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "meta.pt",
    ]

    resumed = TorchTrainer(
        lightning_fns.fit_sharded,
        train_loop_config={"epochs": 3, "full_state_in": str(full)},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(
            tmp_path,
            "resumed",
            failure_config=train.FailureConfig(health_check_timeout_s=PATIENT_S),
        ),
        resume_from_checkpoint=first.checkpoint,
    ).fit()
    (last,) = resumed.metrics_history  # epoch 2 only: Lightning's loops came back too
    assert (last["epoch"], last["step"], last["start_epoch"]) == (2, 3 * STEPS_PER_EPOCH, 2.0)
    assert last["restored_exact"] == 1.0  # every parameter as saved, bit for bit


def test_fsdp2_in_local_mode_with_async_upload(tmp_path: Path) -> None:
    env_before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    result = TorchTrainer(
        lightning_fns.fit_sharded,
        train_loop_config={"epochs": 1, "upload_mode": train.CheckpointUploadMode.ASYNC},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=run_config(tmp_path, "local-sharded"),
    ).fit()
    assert [m["epoch"] for m in result.metrics_history] == [0]
    assert _files(result.checkpoint) == [
        f"{CHECKPOINT_NAME}/{n}" for n in (".metadata", "__0_0.distcp", "meta.pt")
    ]
    # the one-process group Lightning formed is gone, its env undone
    assert not torch.distributed.is_initialized()
    assert {k: os.environ.get(k) for k in env_before} == env_before


def test_get_checkpoint_path_refuses_a_checkpoint_without_a_lightning_file(
    tmp_path: Path,
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"holds no 'checkpoint.ckpt'.*model\.pt"):
        TorchTrainer(
            lightning_fns.fit,
            train_loop_config={"epochs": 1, "root_dir": str(tmp_path / "pl")},
            scaling_config=train.ScalingConfig(num_workers=0),
            run_config=run_config(tmp_path, "foreign"),
            resume_from_checkpoint=train.Checkpoint.from_directory(str(foreign)),
        ).fit()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every_n_epochs": 0}, train.TrainConfigError, r"every_n_epochs=0.*>= 1"),
        ({"every_n_epochs": "2"}, train.TrainConfigError, r"every_n_epochs='2'"),
        ({"every_n_epochs": True}, train.TrainConfigError, r"every_n_epochs=True"),
        (
            {"checkpoint_upload_mode": train.CheckpointUploadMode.NO_UPLOAD},
            train.TrainConfigError,
            r"NO_UPLOAD.*SYNC \(default\) or ASYNC",
        ),
        ({"checkpoint_upload_mode": "sync"}, train.TrainTypeError, r"'sync'.*SYNC or ASYNC"),
        ({"validation": "yes"}, train.TrainTypeError, r"validation='yes'"),
    ],
)
def test_report_callback_refuses_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ReportCallback(**kwargs)


def test_ray_names_are_the_lumos_classes() -> None:
    assert RayTrainReportCallback is ReportCallback
    assert RayDDPStrategy is LumosDDPStrategy
    assert ReportCallback.CHECKPOINT_NAME == CHECKPOINT_NAME == "checkpoint.ckpt"


def test_strategy_refuses_process_group_settings() -> None:
    with pytest.raises(train.TrainConfigError, match=r"process_group_backend='nccl'.*TorchConfig"):
        LumosDDPStrategy(process_group_backend="nccl")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout": 5}, r"LumosModelParallelStrategy\(timeout=5\).*TorchConfig"),
        ({"process_group_backend": "gloo"}, r"process_group_backend='gloo'.*TorchConfig"),
        ({"data_parallel_size": 0}, r"data_parallel_size=0\): pass an int >= 1 or 'auto'"),
        ({"tensor_parallel_size": "2"}, r"tensor_parallel_size='2'\): pass an int >= 1"),
    ],
)
def test_sharded_strategy_refuses_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(train.TrainConfigError, match=match):
        LumosModelParallelStrategy(**kwargs)


def test_mesh_sizes_follow_the_world_size() -> None:
    from lumos.train._internal.lightning.model_parallel import mesh_sizes

    assert mesh_sizes("auto", "auto", 4) == (4, 1)
    assert mesh_sizes("auto", 2, 4) == (2, 2)
    assert mesh_sizes(2, 2, 4) == (2, 2)
    with pytest.raises(train.TrainConfigError, match=r"data_parallel_size=2, tensor_parallel_size"
                       r"='auto'\).*num_workers\) = 4"):  # fmt: skip
        mesh_sizes(2, "auto", 4)
    with pytest.raises(train.TrainConfigError, match=r"tensor_parallel_size=3\).*= 4"):
        mesh_sizes("auto", 3, 4)


def test_prepare_trainer_refuses_lightnings_own_sharded_strategy() -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    theirs = pl.Trainer(
        accelerator="cpu", devices=1, strategy=ModelParallelStrategy(), logger=False
    )
    with pytest.raises(
        train.TrainConfigError,
        match=r"is a ModelParallelStrategy \(Lightning's own.*rank 0's checkpoint folder\); "
        r"for sharded training use lumos\.train\.lightning\.LumosModelParallelStrategy",
    ):
        prepare_trainer(theirs)
    ours = pl.Trainer(
        accelerator="cpu", devices=1, strategy=LumosModelParallelStrategy(), logger=False
    )
    with pytest.raises(train.NotInTrainingFunctionError):  # accepted up to the context
        prepare_trainer(ours)


def test_prepare_trainer_refuses_other_trainers_and_strategies() -> None:
    with pytest.raises(
        train.TrainTypeError, match=r"needs a lightning\.pytorch\.Trainer, got builtins\.str"
    ):
        prepare_trainer("trainer")  # type: ignore[arg-type]
    plain = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    with pytest.raises(train.TrainConfigError, match=r"SingleDeviceStrategy.*LumosDDPStrategy"):
        prepare_trainer(plain)
    ours = pl.Trainer(accelerator="cpu", devices=1, strategy=LumosDDPStrategy(), logger=False)
    with pytest.raises(train.NotInTrainingFunctionError):
        prepare_trainer(ours)
    with pytest.raises(train.NotInTrainingFunctionError), get_checkpoint_path():
        pass


def test_import_without_lightning_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['lightning'] = None  # as if it were not installed\n"
        "import lumos.train.lightning\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'lumos-train[lightning]'" in proc.stderr
