"""Ray Train's names on lumos.train: ``WorkerGroupError`` / ``ControllerError`` raised by
``fit()``, ``UserCallback``, ``Result.filesystem`` / ``get_best_checkpoint``, and a
Train callback that only defines the hooks (what ``lumos.tune``'s ``TuneReportCallback``
is). In-process (``FakeCluster``, local mode) but for one run of ``TorchTrainer`` on Ray."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path
from typing import Any

import fsspec
import pytest
import ray
import train_fns
from conftest import run_config
from fake_runs import make

from lumos import train
from lumos.runtime.testing import FakeCluster
from lumos.storage import StorageIOError

RAY_TRAIN = Path(ray.__file__).parent / "train"


def _ray_names(path: Path) -> set[str]:
    """The names a Ray ``__init__`` exports: its ``__all__`` plus, for ``ray.train``, what
    it imports from ``v2.api`` (parsed: importing ray.train needs pyarrow)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and "v2.api" in node.module:
            names.update(alias.asname or alias.name for alias in node.names)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names.update(ast.literal_eval(node.value))
    return names


# Ray module (under ray/train) -> (lumos module, the extra it needs, Ray names with no
# lumos equivalent: the README's "Coming from Ray" says why)
NO_EQUIVALENT: dict[str, tuple[str, str | None, set[str]]] = {
    "__init__.py": (
        "lumos.train",
        None,
        {"BackendConfig", "LoggingConfig", "PreemptionError", "SyncConfig",
         "TRAIN_DATASET_KEY", "ValidationFn"},
    ),
    "torch/__init__.py": (
        "lumos.train.torch",
        None,
        {"TorchCheckpoint", "accelerate", "backward", "enable_reproducibility",
         "get_devices", "prepare_optimizer"},
    ),
    "lightning/__init__.py": (
        "lumos.train.lightning", "lightning", {"RayDeepSpeedStrategy", "RayFSDPStrategy"}
    ),
    "huggingface/transformers/__init__.py": (
        "lumos.train.huggingface.transformers", "transformers", set()
    ),
}  # fmt: skip


@pytest.mark.parametrize("ray_module", sorted(NO_EQUIVALENT))
def test_every_public_ray_train_name_is_in_lumos_or_listed_as_absent(ray_module: str) -> None:
    lumos_module, extra, absent = NO_EQUIVALENT[ray_module]
    if extra is not None:
        pytest.importorskip(extra)
    ray_names = _ray_names(RAY_TRAIN / ray_module)
    assert absent <= ray_names  # the list names Ray's names, nothing else
    module = importlib.import_module(lumos_module)
    assert sorted(n for n in ray_names - absent if not hasattr(module, n)) == []
    assert sorted(n for n in absent if hasattr(module, n)) == []  # listed, yet there


# -- WorkerGroupError / ControllerError ---------------------------------------------------


def test_a_worker_failure_raises_worker_group_error_with_rays_attributes(tmp_path: Path) -> None:
    trainer = make(train_fns.failing_loop, {"rank": 1}, tmp_path, FakeCluster())
    with pytest.raises(train.WorkerGroupError) as info:
        trainer.fit()
    err = info.value
    assert isinstance(err, train.TrainingFailedError)  # existing handlers still catch it
    assert not isinstance(err, train.ControllerError)
    assert err.worker_failures is err.worker_errors
    assert set(err.worker_failures) == {1}
    assert "bad batch on purpose" in str(err.worker_failures[1])
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is train.WorkerGroupError
    assert set(copy.worker_failures) == {1}


def test_a_driver_side_failure_raises_controller_error(tmp_path: Path) -> None:
    """The run's storage fails for good in the driver (rank -1): Ray's ControllerError."""
    from fsspec.implementations.local import LocalFileSystem

    from lumos.storage.testing import FaultyFileSystem

    faulty = FaultyFileSystem(LocalFileSystem(), enabled=False)

    class BreakStorage(train.Callback):
        def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
            faulty.set_faults(enabled=True, permanent=True, write_failure_rate=1.0)

    trainer = make(
        train_fns.checkpointing_loop,
        {"steps": 3},
        tmp_path,
        FakeCluster(),
        callbacks=[BreakStorage()],
        storage_filesystem=faulty,
    )
    with pytest.raises(train.ControllerError) as info:
        trainer.fit()
    err = info.value
    assert isinstance(err, train.TrainingFailedError)
    assert not isinstance(err, train.WorkerGroupError)
    assert isinstance(err.controller_failure, StorageIOError)
    assert type(pickle.loads(pickle.dumps(err))) is train.ControllerError


def test_torch_trainer_on_ray_raises_worker_group_error(ray_cluster: str, tmp_path: Path) -> None:
    from lumos.train.torch import TorchTrainer

    with pytest.raises(train.WorkerGroupError) as info:
        TorchTrainer(
            train_fns.failing_loop,
            train_loop_config={"rank": 0},
            scaling_config=train.ScalingConfig(num_workers=1),
            run_config=run_config(tmp_path, "wge"),
        ).fit()
    assert "bad batch on purpose" in str(info.value.worker_failures[0])


# -- UserCallback and hook-only callbacks -------------------------------------------------


class _RayStyle(train.UserCallback):
    def __init__(self) -> None:
        self.reports: list[tuple[str, list[dict[str, Any]], bool]] = []
        self.exceptions: list[dict[int, BaseException]] = []

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.reports.append((run_context.run_name, metrics, checkpoint is not None))

    def after_exception(self, run_context: Any, worker_exceptions: Any) -> None:
        self.exceptions.append(dict(worker_exceptions))


def test_user_callback_gets_rays_after_report_and_after_exception(tmp_path: Path) -> None:
    cb = _RayStyle()
    make(train_fns.checkpointing_loop, {"steps": 2}, tmp_path, FakeCluster(), callbacks=[cb]).fit()
    assert [(name, [m["step"] for m in ms], c) for name, ms, c in cb.reports] == [
        ("run", [0], True),
        ("run", [1], True),
    ]
    failing = _RayStyle()
    trainer = make(
        train_fns.failing_loop, {"rank": 1}, tmp_path, FakeCluster(), name="f", callbacks=[failing]
    )
    with pytest.raises(train.WorkerGroupError):
        trainer.fit()
    assert [sorted(e) for e in failing.exceptions] == [[1]]
    assert "bad batch on purpose" in str(failing.exceptions[0][1])


class _HooksOnly:
    """Defines every Train hook without subclassing train.Callback."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_start(self, run_name: str, run_path: str, config: Any) -> None:
        self.calls.append("start")

    def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
        self.calls.append(f"report {metrics['step']}")

    def on_failure(self, failures: Any, will_restart: bool) -> None:
        self.calls.append("failure")

    def on_restart(self, attempt: int, checkpoint: Any) -> None:
        self.calls.append("restart")

    def on_finish(self, result: Any, error: Any) -> None:
        self.calls.append("finish")


def test_an_object_with_every_hook_is_a_train_callback(tmp_path: Path) -> None:
    cb = _HooksOnly()
    assert isinstance(cb, train.Callback)
    make(train_fns.checkpointing_loop, {"steps": 2}, tmp_path, FakeCluster(), callbacks=[cb]).fit()
    assert cb.calls == ["start", "report 0", "report 1", "finish"]


def test_an_object_missing_a_hook_is_refused() -> None:
    class NoFinish:
        def on_start(self, *a: Any) -> None: ...
        def on_report(self, *a: Any) -> None: ...
        def on_failure(self, *a: Any) -> None: ...
        def on_restart(self, *a: Any) -> None: ...

    assert not isinstance(NoFinish(), train.Callback)
    with pytest.raises(ValueError, match=r"callbacks\[0\].*lumos.train.Callback"):
        train.RunConfig(callbacks=[NoFinish()])


# -- Result.filesystem / get_best_checkpoint ----------------------------------------------


def _local_run(tmp_path: Path, losses: list[float]) -> train.Result:
    return train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": len(losses), "losses": losses},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=run_config(tmp_path, "best"),
    ).fit()


def test_result_filesystem_reads_the_run_and_get_best_checkpoint(tmp_path: Path) -> None:
    result = _local_run(tmp_path, [3.0, 1.0, 2.0, 1.0])
    fs = result.filesystem
    assert isinstance(fs, fsspec.AbstractFileSystem)
    assert fs.isdir(result.path)
    assert {Path(p).name for p in fs.ls(result.path)} >= {"checkpoint_0", "checkpoint_3"}
    best = result.get_best_checkpoint("loss", "min")
    assert best is not None
    assert best.path.endswith("/checkpoint_1")
    worst = result.get_best_checkpoint("loss", "max")
    assert worst is not None
    assert worst.path.endswith("/checkpoint_0")
    assert result.get_best_checkpoint("no_such_metric", "min") is None
    with pytest.raises(train.TrainConfigError, match="mode='low'"):
        result.get_best_checkpoint("loss", "low")
    loaded = train.Result.from_path(result.path)
    assert loaded.filesystem.isdir(loaded.path)


def test_result_filesystem_of_a_memory_run_is_the_memory_filesystem() -> None:
    result = train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": 1},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(name="mem", storage_path="memory://ray-names", verbose=False),
    ).fit()
    assert result.filesystem.protocol in ("memory", ("memory",))
    assert result.filesystem.exists(result.path)
