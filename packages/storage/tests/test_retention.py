from __future__ import annotations

import pytest
from pydantic import ValidationError

from lumos.storage import CheckpointRecord, RetentionPolicy


def records(*metrics: dict[str, object]) -> list[CheckpointRecord]:
    return [
        CheckpointRecord(dir_name=f"c{i}", metrics=dict(m), report_index=i)
        for i, m in enumerate(metrics)
    ]


def names(rs: list[CheckpointRecord]) -> list[str]:
    return [r.dir_name for r in rs]


def test_keep_all_when_num_to_keep_is_none() -> None:
    rs = records({}, {}, {})
    assert RetentionPolicy().select_to_delete(rs, "c2") == []


def test_keeps_most_recent_without_score() -> None:
    rs = records({}, {}, {}, {})
    assert names(RetentionPolicy(num_to_keep=2).select_to_delete(rs, "c3")) == ["c0", "c1"]


def test_keeps_best_by_min_score_and_never_the_latest() -> None:
    rs = records({"loss": 0.5}, {"loss": 0.1}, {"loss": 0.3}, {"loss": 0.9})
    policy = RetentionPolicy(num_to_keep=2, score_attribute="loss", score_order="min")
    # best two are c1 and c2; c3 is the latest (worst) and is kept to resume from
    assert names(policy.select_to_delete(rs, "c3")) == ["c0"]


def test_keeps_best_by_max_score() -> None:
    rs = records({"acc": 0.5}, {"acc": 0.9}, {"acc": 0.7}, {"acc": 0.8})
    policy = RetentionPolicy(num_to_keep=2, score_attribute="acc", score_order="max")
    assert names(policy.select_to_delete(rs, "c3")) == ["c0", "c2"]


def test_missing_or_non_numeric_scores_rank_last() -> None:
    rs = records({"loss": 0.2}, {}, {"loss": "n/a"}, {"loss": float("nan")}, {"loss": 0.4})
    policy = RetentionPolicy(num_to_keep=2, score_attribute="loss", score_order="min")
    assert names(policy.select_to_delete(rs, "c4")) == ["c1", "c2", "c3"]


def test_ties_prefer_the_more_recent_checkpoint() -> None:
    rs = records({"loss": 1.0}, {"loss": 1.0}, {"loss": 1.0})
    policy = RetentionPolicy(num_to_keep=1, score_attribute="loss", score_order="min")
    assert names(policy.select_to_delete(rs, "c2")) == ["c0", "c1"]


def test_latest_accepts_a_record() -> None:
    rs = records({"loss": 0.1}, {"loss": 0.9})
    policy = RetentionPolicy(num_to_keep=1, score_attribute="loss", score_order="min")
    assert policy.select_to_delete(rs, rs[1]) == []


@pytest.mark.parametrize("bad", [0, -1])
def test_num_to_keep_must_be_positive(bad: int) -> None:
    with pytest.raises(ValidationError, match="num_to_keep"):
        RetentionPolicy(num_to_keep=bad)


def test_score_order_is_checked() -> None:
    with pytest.raises(ValidationError, match="score_order"):
        RetentionPolicy(num_to_keep=1, score_order="best")  # type: ignore[arg-type]


def test_checkpoint_config_maps_to_retention_policy() -> None:
    from lumos.storage import CheckpointConfig, RetentionPolicy

    config = CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
    )
    assert config.retention() == RetentionPolicy(
        num_to_keep=2, score_attribute="loss", score_order="min"
    )
    assert CheckpointConfig().retention().num_to_keep is None


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"num_to_keep": 0}, ["num_to_keep", "0", "greater than or equal to 1"]),
        ({"checkpoint_score_order": "best"}, ["checkpoint_score_order", "best", "'max' or 'min'"]),
        ({"keep": 3}, ["keep", "Extra inputs are not permitted"]),
    ],
)
def test_checkpoint_config_rejects_bad_values(
    kwargs: dict[str, object], expected: list[str]
) -> None:
    from pydantic import ValidationError

    from lumos.storage import CheckpointConfig

    with pytest.raises(ValidationError) as info:
        CheckpointConfig(**kwargs)  # type: ignore[arg-type]
    for part in expected:
        assert part in str(info.value)


def test_a_pending_validation_is_kept_and_takes_no_place() -> None:
    rs = records({"val": 0.9}, {"val": 0.1}, {"val": 0.5}, {})
    rs[3] = rs[3].model_copy(update={"validation_status": "pending"})
    policy = RetentionPolicy(num_to_keep=1, score_attribute="val", score_order="min")
    # c3 is not judged yet: kept; among the judged, c1 is best; c2 is the latest
    assert names(policy.select_to_delete(rs, "c2")) == ["c0"]
    # once validated, c3 competes like any other checkpoint
    rs[3] = rs[3].model_copy(update={"validation_status": "validated", "metrics": {"val": 0.05}})
    assert names(policy.select_to_delete(rs, "c2")) == ["c0", "c1"]


def test_rolled_back_checkpoints_are_dropped_first() -> None:
    rs = records({"val": 0.1}, {"val": 0.2}, {"val": 0.3})
    rs[0] = rs[0].model_copy(update={"rolled_back": True})
    policy = RetentionPolicy(num_to_keep=2, score_attribute="val", score_order="min")
    assert names(policy.select_to_delete(rs, "c2")) == ["c0"]
    assert names(RetentionPolicy(num_to_keep=2).select_to_delete(rs, "c2")) == ["c0"]
