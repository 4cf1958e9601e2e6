"""ResultGrid / Result: indexing, best result, Pareto front, dataframes, errors."""

from __future__ import annotations

import pytest

from lumos import tune
from lumos.tune import Result, ResultGrid, TrialError


def _result(name: str, loss: float | None, status: str = "TERMINATED", **extra: float) -> Result:
    metrics = {"training_iteration": 3, **extra}
    if loss is not None:
        metrics["loss"] = loss
    error = (
        TrialError(name, 0, "ValueError", "bad", "Traceback...\nValueError: bad")
        if status == "ERROR"
        else None
    )
    return Result(
        metrics=metrics,
        config={"lr": 0.1, "model": {"width": 8}},
        path=f"/exp/{name}",
        error=error,
        history=[{"loss": 1.0, "training_iteration": 1}, metrics],
        trial_id=name[-5:],
        trial_name=name,
        status=status,
        errors=[error] if error else [],
    )


def _grid() -> ResultGrid:
    return ResultGrid(
        [
            _result("trial_00000", 0.5),
            _result("trial_00001", 0.2),
            _result("trial_00002", 0.1, status="PRUNED"),
            _result("trial_00003", None, status="ERROR"),
            _result("trial_00004", float("nan")),
        ],
        metric="loss",
        mode="min",
    )


def test_len_index_iteration_and_counts() -> None:
    grid = _grid()
    assert len(grid) == 5
    assert grid[1].trial_name == "trial_00001"
    assert [r.trial_name for r in grid][-1] == "trial_00004"
    assert grid.num_errors == 1
    assert grid.num_terminated == 4  # pruned trials ended by design
    assert [e.trial_name for e in grid.errors] == ["trial_00003"]
    assert "ValueError: bad" in str(grid.errors[0])  # traceback kept


def test_best_result_uses_the_tune_config_and_skips_nan_errors_and_pruned() -> None:
    grid = _grid()
    assert grid.get_best_result().trial_name == "trial_00001"
    assert grid.get_best_result(include_pruned=True).trial_name == "trial_00002"
    assert grid.get_best_result("loss", "max").trial_name == "trial_00000"


def test_best_result_errors_are_clear() -> None:
    with pytest.raises(tune.TuneError, match="needs a metric and a mode"):
        ResultGrid([_result("trial_00000", 1.0)]).get_best_result()
    with pytest.raises(tune.TuneError, match="mode must be 'min' or 'max'"):
        _grid().get_best_result("loss", "lowest")
    with pytest.raises(tune.TuneError, match="no finished trial reported a finite value of 'acc'"):
        _grid().get_best_result("acc", "max")
    multi = ResultGrid([_result("trial_00000", 1.0)], metric=["loss", "cost"], mode=["min", "min"])
    with pytest.raises(tune.TuneError, match="get_pareto_front"):
        multi.get_best_result()


def test_pareto_front() -> None:
    grid = ResultGrid(
        [
            _result("a", 1.0, cost=1.0),
            _result("b", 2.0, cost=0.5),
            _result("c", 2.0, cost=2.0),  # dominated by a
            _result("d", 0.5, cost=3.0),
        ],
        metric=["loss", "cost"],
        mode=["min", "min"],
    )
    assert sorted(r.trial_name for r in grid.get_pareto_front()) == ["a", "b", "d"]


def test_dataframe_has_one_row_per_trial_with_config_and_last_metrics() -> None:
    df = _grid().get_dataframe()
    assert len(df) == 5
    assert {
        "trial_id",
        "trial_name",
        "status",
        "loss",
        "config/lr",
        "config/model/width",
        "error",
    } <= set(df.columns)
    assert df.loc[1, "loss"] == 0.2
    assert df.loc[3, "error"] == "ValueError: bad"
    assert df.loc[0, "config/model/width"] == 8


def test_metrics_dataframe_is_the_report_history() -> None:
    df = _grid()[0].metrics_dataframe
    assert list(df["training_iteration"]) == [1, 3]
    assert list(df["loss"]) == [1.0, 0.5]


def test_repr_is_short() -> None:
    assert "5 trials" in repr(_grid())
    assert "trial_00003" in repr(_grid()[3])
    assert "ValueError" in repr(_grid()[3])
