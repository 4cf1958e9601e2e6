"""Ray Tune's ``ExperimentPlateauStopper``: end the sweep once the best results plateau."""

from __future__ import annotations

import statistics
from typing import Any

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.metrics import finite_or_none
from lumos.tune._internal.stoppers import Stopper


class ExperimentPlateauStopper(Stopper):
    """Stops the whole sweep when the ``top`` best values of ``metric`` (over all reports
    of all trials) have a standard deviation of at most ``std`` for more than
    ``patience`` reports in a row. Ray's arguments and rule.

    Args:
        metric: The metric to watch (a report without a finite value of it is skipped).
        std: The standard deviation at or below which the best values count as a plateau.
        top: How many of the best values to consider (an integer above 1).
        mode: ``"min"`` or ``"max"``: which values are the best.
        patience: Reports to wait, once on the plateau, before stopping.

    Raises:
        TuneConfigError: an argument is out of range (also a ``ValueError``).

    Example:
        >>> tune.TuneConfig(stop=tune.stopper.ExperimentPlateauStopper("loss", top=5))
    """

    def __init__(
        self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0
    ) -> None:
        if mode not in ("min", "max"):
            raise TuneConfigError(
                f"ExperimentPlateauStopper(mode={mode!r}): must be 'min' or 'max'"
            )
        if isinstance(top, bool) or not isinstance(top, int) or top <= 1:
            raise TuneConfigError(
                f"ExperimentPlateauStopper(top={top!r}): must be an integer greater than 1"
            )
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise TuneConfigError(
                f"ExperimentPlateauStopper(patience={patience!r}): must be an integer >= 0"
            )
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0:
            raise TuneConfigError(
                f"ExperimentPlateauStopper(std={std!r}): must be a number greater than 0"
            )
        self._metric = metric
        self._std = float(std)
        self._top = top
        self._mode = mode
        self._patience = patience
        self._iterations = 0
        self._top_values: list[float] = []

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = finite_or_none(result.get(self._metric))
        if value is None:
            return self.stop_all()
        values = sorted([*self._top_values, value])
        self._top_values = values[: self._top] if self._mode == "min" else values[-self._top :]
        self._iterations = self._iterations + 1 if self.has_plateaued() else 0
        return self.stop_all()

    def has_plateaued(self) -> bool:
        """Whether the ``top`` best values are within ``std`` of each other."""
        return (
            len(self._top_values) == self._top and statistics.pstdev(self._top_values) <= self._std
        )

    def stop_all(self) -> bool:
        """Whether the sweep ends (on the plateau for more than ``patience`` reports)."""
        return self.has_plateaued() and self._iterations >= self._patience
