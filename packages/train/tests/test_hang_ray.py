"""The hang watchdog on real Ray and torch (gloo): a rank stalls, the others wait in an
all-reduce; the culprit is named, every rank's stacks are written, the run resumes."""

from __future__ import annotations

import json
from pathlib import Path

import hang_fns
import pytest
from conftest import run_config

from lumos import train
from lumos.storage import RunStorage
from lumos.train.torch import TorchConfig, TorchTrainer

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(autouse=True)
def _ship_hang_fns(ray_cluster: str) -> None:
    """The workers cannot import tests/: the functions travel by value."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(hang_fns)


def _trainer(tmp_path: Path, name: str, how: str, culprit: int, max_failures: int) -> TorchTrainer:
    config = {
        "steps": 4, "at": 2, "culprit": culprit, "how": how,
        "marker": str(tmp_path / f"{name}.stalled"), "tmp": str(tmp_path),
    }  # fmt: skip
    failure = train.FailureConfig(max_failures=max_failures, hang_timeout_s=3.0)
    return TorchTrainer(
        hang_fns.allreduce_loop,
        train_loop_config=config,
        torch_config=TorchConfig(timeout_s=600),  # gloo would wait 10 minutes
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, name, failure_config=failure, verbose=1),
    )


@pytest.mark.parametrize("how", ["sleep", "loop", "deadlock"])
def test_a_stalled_rank_is_named_its_stacks_written_and_the_run_resumes(
    tmp_path: Path, how: str, capfd: pytest.CaptureFixture[str]
) -> None:
    culprit = {"sleep": 1, "loop": 0, "deadlock": 1}[how]
    result = _trainer(tmp_path, how, how, culprit, max_failures=1).fit()
    assert result.metrics["step"] == 3
    assert result.metrics["start"] == 2
    state = RunStorage(tmp_path, how).load_state()
    assert state is not None
    assert [a.status for a in state.attempts] == ["errored", "finished"]
    folder = tmp_path / how / "_lumos" / "hangs" / "attempt-0"
    summary = json.loads((folder / "hang.json").read_text())
    assert summary["culprits"] == [culprit]
    assert "all_reduce" in summary["why"][str(culprit)]
    assert "hang_fns.py" in summary["where"][str(culprit)]
    stacks = {r: (folder / f"rank-{r}.txt").read_text() for r in (0, 1)}
    assert "all_reduce" in stacks[1 - culprit]
    expected = {"sleep": "stall", "loop": "_endless_loop", "deadlock": "_deadlock"}[how]
    assert expected in stacks[culprit]
    if how == "deadlock":
        assert "lock-b-holder" in stacks[culprit]  # every thread's stack
    err = capfd.readouterr().err
    assert f"rank {culprit} on node " in err
    assert "stuck at " in err
    assert "hang_fns.py:" in err


def test_with_no_retry_left_the_error_carries_the_culprit_and_the_stacks_path(
    tmp_path: Path,
) -> None:
    with pytest.raises(train.WorkerGroupError) as info:
        _trainer(tmp_path, "raise", "sleep", 1, max_failures=0).fit()
    error = info.value.worker_errors[1]
    cause = getattr(error, "cause", None)
    assert isinstance(cause, train.RankStuckError)
    assert cause.culprits == (1,)
    assert cause.node_id
    assert cause.stacks_path.endswith("raise/_lumos/hangs/attempt-0")
    assert "time.sleep" in getattr(error, "traceback", "") or "stall" in error.traceback


def test_a_group_avoiding_a_node_is_placed_on_another() -> None:
    import ray

    from lumos.runtime import WorkerGroup, WorkerGroupSpec

    here = ray.get_runtime_context().get_node_id()
    other = "f" * len(here)  # not a node of this cluster: the selector keeps off it
    group = WorkerGroup.start(WorkerGroupSpec(num_workers=2, avoid_nodes=(other,)))
    try:
        assert {w.node_id for w in group.workers} == {here}
    finally:
        group.shutdown()


@pytest.mark.long  # plain nox: test_hang_unit (imports, saves, uploads: expected waits)
def test_slow_imports_saves_and_uploads_are_no_hang(tmp_path: Path) -> None:
    # each takes 3x the timeout on rank 0 while rank 1 waits in an all-reduce
    wait_s = 6.0
    (tmp_path / "slow_module.py").write_text(f"import time\ntime.sleep({wait_s})\n")
    failure = train.FailureConfig(max_failures=0, hang_timeout_s=2.0)
    result = TorchTrainer(
        hang_fns.slow_but_alive_loop,
        train_loop_config={"tmp": str(tmp_path), "wait_s": wait_s},
        torch_config=TorchConfig(timeout_s=600),
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "alive", failure_config=failure),
    ).fit()
    assert result.metrics["step"] == 3
    assert result.checkpoint is not None
    assert not (tmp_path / "alive" / "_lumos" / "hangs").exists()
