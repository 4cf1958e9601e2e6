"""Configs and trainer arguments: bad input fails at construction with a clear message."""

from __future__ import annotations

import dataclasses
import pickle
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from lumos import train
from lumos.train.torch import TorchConfig, TorchTrainer


def test_defaults() -> None:
    sc = train.ScalingConfig()
    assert sc.num_workers == 1
    assert sc.worker_resources() == {"CPU": 1.0}
    assert train.ScalingConfig(use_gpu=True).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    rc = train.RunConfig()
    assert rc.name is None
    assert rc.storage_path is None
    assert rc.failure_config.max_failures == 0
    assert rc.checkpoint_config.checkpoint_score_order == "max"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda: train.ScalingConfig(num_workers=-1),
            ["num_workers", "-1", "int >= 1", "0 (local mode"],
        ),
        (
            lambda: train.ScalingConfig(placement_strategy="ROUND"),
            ["placement_strategy", "ROUND", "PACK"],
        ),
        (lambda: train.ScalingConfig(resources_per_worker={"CPU": -1}), ["CPU", "-1", ">= 0"]),
        (lambda: train.ScalingConfig(resources_per_worker={"GPU": 1}), ["use_gpu=True"]),
        (lambda: train.FailureConfig(max_failures=-2), ["max_failures", "-2", "-1"]),
        (
            lambda: train.CheckpointConfig(checkpoint_score_order="maximize"),
            ["checkpoint_score_order", "maximize", "'max' or 'min'"],
        ),
        (lambda: train.CheckpointConfig(num_to_keep=0), ["num_to_keep", "0"]),
        (lambda: train.RunConfig(name="a/b"), ["name", "a/b"]),
        (lambda: train.RunConfig(storage_path=""), ["storage_path", "fsspec URL"]),
        (lambda: train.RunConfig(storage_filesystem="s3"), ["storage_filesystem", "fsspec"]),
        (lambda: train.RunConfig(callbacks=[object()]), ["callbacks[0]", "train.Callback"]),
        (lambda: train.RunConfig(nmae="x"), ["nmae", "Extra inputs"]),
        (lambda: TorchConfig(backend="mpi"), ["backend", "mpi", "'gloo' or 'nccl'"]),
        (lambda: TorchConfig(timeout_s=0), ["timeout_s", "greater than 0"]),
    ],
)
def test_bad_config_values_name_field_value_and_allowed(make, words) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    text = str(info.value)
    for word in words:
        assert word in text, f"{word!r} missing from: {text}"


def test_max_failures_minus_one_means_unlimited() -> None:
    assert train.FailureConfig(max_failures=-1).max_failures == -1


def test_configs_are_frozen_and_pickle() -> None:
    rc = train.RunConfig(name="x", failure_config=train.FailureConfig(max_failures=2))
    with pytest.raises(ValidationError):
        rc.name = "y"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(rc)) == rc


def _two_args(a, b) -> None:
    pass


def _no_args() -> None:
    pass


def _one_arg(config) -> None:
    pass


def test_unpicklable_train_fn_is_rejected_before_anything_starts() -> None:
    lock = threading.Lock()

    def fn(config):
        with lock:
            pass

    with pytest.raises(train.TrainConfigError, match=r"cannot be pickled.*lock"):
        train.DataParallelTrainer(fn)


def test_unpicklable_config_is_rejected() -> None:
    with pytest.raises(train.TrainConfigError, match="train_loop_config cannot be pickled"):
        train.DataParallelTrainer(_one_arg, train_loop_config={"lock": threading.Lock()})


def test_train_fn_signature_checks() -> None:
    with pytest.raises(train.TrainConfigError, match="requires 2 arguments"):
        train.DataParallelTrainer(_two_args)
    with pytest.raises(train.TrainConfigError, match="takes no argument"):
        train.DataParallelTrainer(_no_args, train_loop_config={"a": 1})
    with pytest.raises(train.TrainConfigError, match="not callable"):
        train.DataParallelTrainer(42)  # type: ignore[arg-type]
    with pytest.raises(train.TrainConfigError, match="pass a dict"):
        train.DataParallelTrainer(_one_arg, train_loop_config=[1])  # type: ignore[arg-type]
    with pytest.raises(train.TrainConfigError, match=r"not a train\.ScalingConfig"):
        train.DataParallelTrainer(_one_arg, scaling_config={"num_workers": 2})  # type: ignore[arg-type]
    assert train.DataParallelTrainer(_no_args)._pass_config is False
    assert train.DataParallelTrainer(_one_arg)._pass_config is True


def test_nccl_without_gpu_is_rejected() -> None:
    with pytest.raises(train.TrainConfigError, match="use_gpu=True"):
        TorchTrainer(_one_arg, torch_config=TorchConfig(backend="nccl"))


def test_training_failed_error_pickles_with_every_worker_error() -> None:
    from lumos.runtime import RemoteError

    err = train.TrainingFailedError(
        "run failed",
        {0: RemoteError.from_exception(ValueError("a"), rank=0), 1: RuntimeError("died")},
        failures=2,
    )
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, train.TrainingFailedError)
    assert copy.failures == 2
    assert set(copy.worker_errors) == {0, 1}
    assert copy.worker_errors[0].message == "a"  # type: ignore[attr-defined]
    assert "rank 1: died" in str(copy)


def test_api_outside_a_training_function_says_where_to_call_it() -> None:
    with pytest.raises(RuntimeError, match=r"train.report\(\) can only be called inside"):
        train.report({"x": 1})
    with pytest.raises(RuntimeError, match="get_context"):
        train.get_context()
    with pytest.raises(train.TrainError, match="get_checkpoint"):
        train.get_checkpoint()


def test_misuse_errors_are_train_errors_and_builtin_errors() -> None:
    assert issubclass(train.TrainConfigError, train.TrainError)
    assert issubclass(train.TrainConfigError, ValueError)
    assert issubclass(train.CheckpointReportError, ValueError)
    assert issubclass(train.NotInTrainingFunctionError, train.TrainError)
    assert issubclass(train.NotInTrainingFunctionError, RuntimeError)
    assert issubclass(train.TrainingFailedError, train.TrainError)


def test_result_takes_only_its_public_fields(tmp_path: Path) -> None:
    init = [f.name for f in dataclasses.fields(train.Result) if f.init]
    assert init == ["metrics", "checkpoint", "best_checkpoints", "path", "error"]
    result = train.Result(metrics={}, checkpoint=None, best_checkpoints=[], path=str(tmp_path))
    assert result.metrics_history == []  # reads the (empty) history at ``path``


def test_verbose_takes_bools_and_levels() -> None:
    assert train.RunConfig().verbose == 1
    assert train.RunConfig(verbose=False).verbose == 0
    assert train.RunConfig(verbose=True).verbose == 1
    assert train.RunConfig(verbose=2).verbose == 2
