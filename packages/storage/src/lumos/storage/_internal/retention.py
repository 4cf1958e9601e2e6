"""Which committed checkpoints to keep."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lumos.storage._internal.state import CheckpointRecord


class RetentionPolicy(BaseModel):
    """Keep ``num_to_keep`` checkpoints; never delete the latest committed one.

    With ``score_attribute`` the best ``num_to_keep`` by that metric are kept
    (checkpoints whose metrics lack it, or hold a non-number, rank last);
    without it the most recent ones are kept. The latest checkpoint is always
    kept in addition, since a restart resumes from it.

    A checkpoint whose validation is pending is not judged yet: it is kept and takes
    no place among the ``num_to_keep`` (its score may come with the validation). A
    rolled-back checkpoint ranks after every other one, so it is dropped first.

    Args:
        num_to_keep: How many to keep; None keeps all.
        score_attribute: Metric that ranks checkpoints, e.g. ``"loss"``.
        score_order: ``"max"`` keeps the highest scores, ``"min"`` the lowest.

    Example:
        >>> policy = RetentionPolicy(num_to_keep=2, score_attribute="loss", score_order="min")
    """

    model_config = ConfigDict(frozen=True)

    num_to_keep: int | None = Field(default=None, ge=1)
    score_attribute: str | None = None
    score_order: Literal["max", "min"] = "max"

    def _score(self, record: CheckpointRecord) -> float | None:
        assert self.score_attribute is not None
        value = record.metrics.get(self.score_attribute)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if math.isnan(value):
            return None
        return float(value)

    def select_to_delete(
        self, records: Sequence[CheckpointRecord], latest: str | CheckpointRecord | None
    ) -> list[CheckpointRecord]:
        """The records to delete, in their original (oldest first) order.

        Args:
            records: The committed checkpoints, oldest first.
            latest: The latest checkpoint (its record or dir name); never selected.

        Returns:
            The records that fall outside the policy.
        """
        if self.num_to_keep is None:
            return []
        latest_name = latest.dir_name if isinstance(latest, CheckpointRecord) else latest
        order = [i for i, r in enumerate(records) if not r.validation_pending]
        sign = -1.0 if self.score_order == "max" else 1.0

        def key(i: int) -> tuple[int, int, float, int]:
            rolled = int(records[i].rolled_back)
            if self.score_attribute is None:
                return (rolled, 0, 0.0, -i)  # most recent first
            score = self._score(records[i])
            if score is None:
                return (rolled, 1, 0.0, -i)
            return (rolled, 0, sign * score, -i)  # ties: the more recent one wins

        keep = set(sorted(order, key=key)[: self.num_to_keep])
        judged = set(order)
        return [
            r
            for i, r in enumerate(records)
            if i in judged and i not in keep and (latest_name is None or r.dir_name != latest_name)
        ]


class CheckpointConfig(BaseModel):
    """Which committed checkpoints of a run to keep (``lumos.train`` and ``lumos.tune`` share it).

    The latest checkpoint is always kept as well, since a restart resumes from it.

    Args:
        num_to_keep: Keep at most this many checkpoints (plus the latest when it is
            not among them); at least 1. ``None`` keeps all.
        checkpoint_score_attribute: Metric of the report that ranks checkpoints;
            without it the most recent ones are kept.
        checkpoint_score_order: ``"max"`` (default) or ``"min"``: which end of the
            score is best.

    Example:
        >>> config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
        ...                           checkpoint_score_order="min")
        >>> config.retention().score_order
        'min'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_to_keep: int | None = Field(default=None, ge=1)
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"

    def retention(self) -> RetentionPolicy:
        """The storage retention policy this config means."""
        return RetentionPolicy(
            num_to_keep=self.num_to_keep,
            score_attribute=self.checkpoint_score_attribute,
            score_order=self.checkpoint_score_order,
        )
