"""lumos.train.huggingface.transformers: a 2-worker HF Trainer fit on a real local Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import hf_fns
import pytest
from conftest import run_config

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchTrainer

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

MAX_STEPS = 6
SAVE_STEPS = 3


@pytest.fixture(autouse=True)
def _offline(ray_cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is downloaded (the workers inherit the driver's environment), and the
    workers get ``hf_fns`` by value (they cannot import tests/)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(hf_fns)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _fit(tmp_path: Path, name: str, **config: object) -> tuple[train.Result, Path]:
    out = tmp_path / f"{name}-out"
    out.mkdir()
    loop = {"out": str(out), "max_steps": MAX_STEPS, "save_steps": SAVE_STEPS, **config}
    result = TorchTrainer(
        hf_fns.hf_fit,
        train_loop_config=loop,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, name, failure_config=train.FailureConfig(max_failures=1)),
    ).fit()
    return result, out


@pytest.mark.usefixtures("no_leaks")
def test_two_worker_fit_reports_metrics_and_checkpoints(tmp_path: Path) -> None:
    result, out = _fit(tmp_path, "fit")
    for rank in (0, 1):  # the Trainer ran in lumos's process group, as this rank
        seen = json.loads((out / f"attempt0_rank{rank}.json").read_text())
        assert seen["world_size"] == 2
        assert seen["process_index"] == rank
        assert seen["class"] == "LumosTrainer"  # prepare_trainer's subclass
        assert seen["global_step"] == MAX_STEPS
    # the final report: the Trainer's summary with the latest value of every metric
    assert result.metrics["step"] == MAX_STEPS
    assert {"train_loss", "loss", "eval_loss", "learning_rate", "epoch"} <= set(result.metrics)
    # one report per optimizer step (a save step's logs go with its checkpoint), then the summary
    steps = [row["step"] for row in result.metrics_history]
    assert steps == [*range(1, MAX_STEPS + 1), MAX_STEPS]
    assert "train_loss" in result.metrics_history[-1]
    assert "train_loss" not in result.metrics_history[-2]
    # every save is a committed checkpoint named as the Trainer's folder, in Ray's layout
    names = [os.path.basename(c.path) for c, _ in result.best_checkpoints]
    assert names == ["checkpoint-3", "checkpoint-6"]
    for ckpt, metrics in result.best_checkpoints:
        step = int(os.path.basename(ckpt.path).split("-")[1])
        assert metrics["step"] == step
        assert "eval_loss" in metrics  # evaluated at the save step, reported with it
        folder = Path(ckpt.path) / "checkpoint"
        state = json.loads((folder / "trainer_state.json").read_text())
        assert state["global_step"] == step
        # rank 0's files and each rank's own RNG state, merged
        files = {p.name for p in folder.iterdir()}
        assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert result.checkpoint is not None
    assert result.checkpoint.path == result.best_checkpoints[-1][0].path


@pytest.mark.long  # plain nox: test_two_worker_fit_..., test_ray's sigkill
@pytest.mark.usefixtures("no_leaks")
def test_worker_sigkill_resumes_from_the_checkpoints_global_step(tmp_path: Path) -> None:
    result, out = _fit(tmp_path, "resume", die_at=SAVE_STEPS + 1)
    assert not (out / "attempt0_rank1.json").exists()  # killed before the end
    for rank in (0, 1):
        again = json.loads((out / f"attempt1_rank{rank}.json").read_text())
        assert again["resumed_at"] == SAVE_STEPS  # train(resume_from_checkpoint=...)
        assert again["global_step"] == MAX_STEPS
    state = RunStorage(str(tmp_path), "resume").load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["errored", "finished"]
    assert result.metrics["step"] == MAX_STEPS
    names = [os.path.basename(c.path) for c, _ in result.best_checkpoints]
    assert names == ["checkpoint-3", "checkpoint-6"]
    # the resumed attempt continued after step 3: steps 4.. once each (the run's history)
    steps = [row["step"] for row in result.metrics_history]
    assert steps[-4:] == [4, 5, 6, 6]


def _fit_fails(tmp_path: Path, fn: Any, name: str) -> tuple[train.TrainingFailedError, Path]:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(train.TrainingFailedError) as info:
        TorchTrainer(
            fn,
            train_loop_config={"out": str(out)},
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=run_config(tmp_path, name),
        ).fit()
    return info.value, out


def test_training_arguments_outside_the_process_group_are_refused(tmp_path: Path) -> None:
    error, _ = _fit_fails(tmp_path, hf_fns.hf_outside_group, "outside")
    text = str(error.worker_errors[1])
    assert "process 0 of 1" in text
    assert "rank 1 of 2" in text
    assert "inside the training function" in text


def test_fsdp_asked_of_a_trainer_on_cpu_workers_is_refused_not_ignored(tmp_path: Path) -> None:
    """accelerate applies a Trainer's FSDP only on GPU (accelerator) workers: on CPU it
    would train unsharded with DDP, silently. prepare_trainer names the field instead."""
    error, out = _fit_fails(tmp_path, hf_fns.hf_fsdp_on_cpu, "fsdp-cpu")
    assert (out / "plugin-0").read_text() == "None"  # accelerate dropped the FSDP plugin
    text = str(error.worker_errors[0])
    assert "TrainingArguments(fsdp=True)" in text
    assert "parallel_strategy='fsdp'" in text


def test_prepare_trainer_refuses_what_is_not_a_trainer() -> None:
    from lumos.train.huggingface.transformers import prepare_trainer

    with pytest.raises(train.TrainTypeError, match=r"expected a transformers\.Trainer, got dict"):
        prepare_trainer({"model": None})  # type: ignore[arg-type]


def test_missing_extra_names_the_pip_command() -> None:
    # a Python where `import transformers` fails (what an install without the extra sees)
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import lumos.train.huggingface.transformers as hf\n"
        "try:\n    hf.ReportCallback\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "pip install 'lumos-train[transformers]'" in done.stdout
