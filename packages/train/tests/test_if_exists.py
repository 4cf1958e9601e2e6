"""Train runs never share a directory by accident: unique default names and
``RunConfig(if_exists="resume" | "error" | "new")``, in local mode (this process) and on
the fake cluster (the controller path a Ray run takes)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import train_fns

from lumos import train
from lumos.runtime._internal import run_claim
from lumos.runtime.testing import FakeCluster
from lumos.storage import RunState, RunStorage
from lumos.train._internal.console import Console
from lumos.train._internal.run_claim import load_or_create_state

TRAINED: list[int] = []


def counting_loop(config: dict[str, Any]) -> None:
    TRAINED.append(1)
    train.report({"step": 0, "value": config.get("value", 0)})


def local(tmp_path: Path, **run_kw: Any) -> train.DataParallelTrainer:
    run_kw.setdefault("verbose", True)
    return train.DataParallelTrainer(
        counting_loop,
        train_loop_config={"value": run_kw.pop("value", 0)},
        scaling_config=train.ScalingConfig(num_workers=0),
        run_config=train.RunConfig(storage_path=str(tmp_path), **run_kw),
    )


def on_cluster(tmp_path: Path, cluster: FakeCluster, **run_kw: Any) -> train.DataParallelTrainer:
    run_kw.setdefault("verbose", True)
    return train.DataParallelTrainer(
        train_fns.checkpointing_loop,
        train_loop_config={"steps": 2},
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(storage_path=str(tmp_path), **run_kw),
        _group_factory=cluster.start,
    )


@pytest.fixture(autouse=True)
def _trained() -> None:
    TRAINED.clear()


def runs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if (p / "_lumos" / "run_state.json").exists())


def test_default_names_started_in_the_same_second_are_two_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = time.gmtime()
    monkeypatch.setattr(run_claim.time, "gmtime", lambda *a: second)
    first = local(tmp_path, verbose=False).fit()
    other = local(tmp_path, verbose=False).fit()
    assert first.path != other.path
    assert len(TRAINED) == 2
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", second)
    names = runs(tmp_path)
    assert len(names) == 2
    for name in names:
        assert re.fullmatch(rf"train-{stamp}-[0-9a-f]{{6}}", name), name


def test_a_clashing_generated_name_draws_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_claim.secrets.token_hex
    draws = iter(["abc123", "abc123"])
    monkeypatch.setattr(run_claim.secrets, "token_hex", lambda n: next(draws, None) or real(n))
    first = local(tmp_path, verbose=False).fit()
    other = local(tmp_path, verbose=False).fit()  # drew the same name first: detected
    assert Path(first.path).name.endswith("-abc123")
    assert Path(other.path).name != Path(first.path).name
    assert len(TRAINED) == 2
    assert len(runs(tmp_path)) == 2


def test_resume_returns_a_finished_run_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = local(tmp_path, name="run", value=1).fit()
    capsys.readouterr()
    again = local(tmp_path, name="run", value=2).fit()  # same name: the same run (Ray Train)
    assert len(TRAINED) == 1
    assert again.metrics == first.metrics
    err = capsys.readouterr().err
    assert re.search(
        rf"run 'run' in {re.escape(str(tmp_path / 'run'))} already finished at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d; returning its stored result "
        r"\(RunConfig\(if_exists='new'\) runs it again\)",
        err,
    ), err


def test_error_refuses_a_stored_run_in_local_mode_and_on_a_cluster(tmp_path: Path) -> None:
    local(tmp_path, name="run").fit()
    with pytest.raises(train.TrainConfigError) as info:
        local(tmp_path, name="run", if_exists="error").fit()
    text = str(info.value)
    for part in (
        "if_exists='error'",
        "run named 'run'",
        str(tmp_path / "run"),
        "'resume'",
        "'new'",
    ):
        assert part in text
    cluster = FakeCluster()
    on_cluster(tmp_path, cluster, name="ray-run", if_exists="error").fit()  # new: no refusal
    with pytest.raises(train.TrainConfigError, match="if_exists='error'"):
        on_cluster(tmp_path, cluster, name="ray-run", if_exists="error").fit()
    assert len(cluster.groups) == 1  # refused before any worker started
    assert len(TRAINED) == 1


def test_new_starts_a_run_beside_it_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local(tmp_path, name="run").fit()
    capsys.readouterr()
    second = local(tmp_path, name="run", if_exists="new").fit()
    assert Path(second.path).name == "run-2"
    assert (
        f"[lumos.train] run 'run' already exists at {tmp_path / 'run'}: starting a new run "
        "'run-2' beside it (RunConfig(if_exists='new'))"
    ) in capsys.readouterr().err
    cluster = FakeCluster()
    third = on_cluster(tmp_path, cluster, name="run", if_exists="new").fit()
    assert Path(third.path).name == "run-3"
    assert third.metrics["step"] == 1
    assert runs(tmp_path) == ["run", "run-2", "run-3"]
    assert len(TRAINED) == 2


def test_resume_on_the_cluster_resumes_the_named_run(tmp_path: Path) -> None:
    cluster = FakeCluster()
    first = on_cluster(tmp_path, cluster, name="run").fit()
    again = on_cluster(tmp_path, cluster, name="run", if_exists="resume").fit()
    assert again.checkpoint is not None
    assert first.checkpoint is not None
    assert again.checkpoint.path == first.checkpoint.path
    assert len(cluster.groups) == 1  # finished: not trained again


def test_a_run_created_meanwhile_is_a_detected_collision(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "run")
    storage.save_state(RunState(name="run"))  # another driver got there first
    with pytest.raises(train.TrainConfigError, match="created by another driver"):
        load_or_create_state(storage, Console(0), fresh=True)
    assert load_or_create_state(storage, Console(0)).name == "run"  # a resume takes it


def test_new_under_torchrun_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(train.TrainConfigError, match=r"if_exists='new'\) under torchrun"):
        local(tmp_path, name="run", if_exists="new").fit()
    assert TRAINED == []


@pytest.mark.parametrize("value", ["overwrite", "", None, 0])
def test_a_bad_if_exists_is_a_clear_error(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        train.RunConfig(if_exists=value)
    assert f"if_exists={value!r} is not allowed; use 'resume'" in str(info.value)
    assert "'error'" in str(info.value)
    assert "'new'" in str(info.value)


def test_every_torchrun_rank_gets_the_same_default_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # A random default name per rank would split one torchrun job into two runs.
    from lumos.train._internal.run_claim import torchrun_run_name

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f2a9c1e-77b0-4c1d")
    names = set()
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        names.add(torchrun_run_name())
    assert names == {"train-torchrun-3f2a9c1e-77b0-4c1d"}
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    with pytest.raises(
        train.TrainConfigError, match=r"TORCHELASTIC_RUN_ID.*RunConfig\(name=\.\.\.\)"
    ):
        torchrun_run_name()
