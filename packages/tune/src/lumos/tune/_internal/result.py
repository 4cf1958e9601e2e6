"""Results of a sweep: one :class:`Result` per trial, gathered in a :class:`ResultGrid`."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from fsspec import AbstractFileSystem

from lumos.storage import Checkpoint, RunStorage
from lumos.tune._internal.errors import TrialError, TuneConfigError, TuneError
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.metrics import finite_or_none, flatten
from lumos.tune._internal.ranking import pareto_front, scope_window, scoped_value, signed_values
from lumos.tune._internal.trial import ExploitRecord, Trial, TrialStatus
from lumos.tune._internal.trial_views import HistoryView, checked_index

if TYPE_CHECKING:
    import pandas as pd


class Result:
    """The outcome of one trial.

    Attributes:
        metrics: The last reported metrics (with ``training_iteration``).
        config: The trial's config.
        checkpoint: The trial's latest committed checkpoint, or None.
        path: URL / local path of the trial's directory.
        error: The error that ended the trial (status ERROR), else None.
        trial_id: The trial's short id.
        trial_name: The trial's name.
        status: ``"TERMINATED"``, ``"PRUNED"`` or ``"ERROR"`` (``"PENDING"`` if it never ran).
        errors: Every error the trial raised, retried ones included.
        exploits: Every clone population-based training made of another trial into this
            one (``donor``, ``step``, ``old_config``, ``new_config``), in order.

    Example:
        >>> best = grid.get_best_result()
        >>> best.config, best.metrics["loss"], best.checkpoint
    """

    def __init__(
        self,
        metrics: dict[str, Any],
        config: dict[str, Any],
        path: str,
        checkpoint: Checkpoint | None = None,
        error: TrialError | None = None,
        history: Sequence[dict[str, Any]] | None = None,
        trial_id: str = "",
        trial_name: str = "",
        status: str = "TERMINATED",
        errors: list[TrialError] | None = None,
        exploits: Sequence[ExploitRecord] | None = None,
        filesystem: AbstractFileSystem | None = None,
    ) -> None:
        self.metrics = metrics
        self.config = config
        self.path = path
        self.checkpoint = checkpoint
        self.error = error
        self.trial_id = trial_id
        self.trial_name = trial_name
        self.status = status
        self.errors = list(errors or [])
        self.exploits = list(exploits or [])
        # A trial's HistoryView is kept as it is (it shares the driver's rows, which never
        # change, and copies a row only when one is read): a 10,000-trial grid holds each
        # report once, not twice.
        self._history: Sequence[dict[str, Any]] = (
            history if isinstance(history, HistoryView) else list(history or [])
        )
        self._filesystem = filesystem

    @classmethod
    def from_trial(cls, trial: Trial, filesystem: AbstractFileSystem) -> Result:
        """The result of a trial (a frozen snapshot of it)."""
        checkpoint = None
        if trial.checkpoint_dir is not None:
            checkpoint = Checkpoint(trial.path.rstrip("/") + "/" + trial.checkpoint_dir, filesystem)
        return cls(
            metrics=dict(trial.last_result),
            config=trial.config,
            path=trial.path,
            checkpoint=checkpoint,
            error=trial.error,
            history=trial.history,
            trial_id=trial.trial_id,
            trial_name=trial.trial_name,
            status=trial.status.value,
            errors=list(trial.errors),
            exploits=list(trial.exploits),
            filesystem=filesystem,
        )

    @classmethod
    def _of_finished_sweep(cls, trial: LiveTrial, filesystem: AbstractFileSystem) -> Result:
        """The result of a trial of a sweep that is over: as :meth:`from_trial` of its
        snapshot, but sharing the trial's config, metrics and history instead of copying
        them (the driver keeps no trial once the grid is built: a 10,000-trial grid costs
        one small object per trial on top of the rows)."""
        checkpoint = None
        if trial.checkpoint_dir is not None:
            checkpoint = Checkpoint(trial.path.rstrip("/") + "/" + trial.checkpoint_dir, filesystem)
        errors = [TrialError.from_record(e) for e in trial.errors]
        error = errors[-1] if trial.status is TrialStatus.ERROR and errors else None
        return cls(
            metrics=dict(trial.last_result),
            config=trial.config,
            path=trial.path,
            checkpoint=checkpoint,
            error=error,
            history=trial.history_view(),
            trial_id=trial.trial_id,
            trial_name=trial.trial_name,
            status=trial.status.value,
            errors=errors,
            exploits=trial.exploits,
            filesystem=filesystem,
        )

    @property
    def filesystem(self) -> AbstractFileSystem:
        """The fsspec filesystem that holds :attr:`path` (Ray's ``Result.filesystem``).

        Ray returns a ``pyarrow.fs.FileSystem``; lumos stores on fsspec, so this is the
        ``fsspec.AbstractFileSystem`` the trial wrote with (local disk for a local path).
        ``fs.open``, ``fs.ls``, ``fs.exists`` take :attr:`path` as it is; pyarrow takes an
        fsspec filesystem where it takes its own (``filesystem=result.filesystem``), and
        pandas reads what ``result.filesystem.open(...)`` opens.

        Example:
            >>> result = grid.get_best_result()
            >>> result.filesystem.ls(result.path)
        """
        if self._filesystem is not None:
            return self._filesystem
        from lumos.storage import resolve_filesystem

        return resolve_filesystem(self.path or ".")[0]  # a Result built by hand

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """The trial's kept checkpoints with the metrics reported with each, oldest first.

        Which are kept is ``RunConfig(checkpoint_config=CheckpointConfig(...))``'s choice
        (``num_to_keep``, ``checkpoint_score_attribute``).

        Example:
            >>> for checkpoint, metrics in grid[0].best_checkpoints:
            ...     print(checkpoint.path, metrics["loss"])
        """
        if self._filesystem is None or not self.path:
            return []
        parent, name = posixpath.split(self.path.rstrip("/"))
        storage = RunStorage(parent, name, self._filesystem)
        state = storage.load_state()
        if state is None:
            return []
        return [(storage.checkpoint(c.dir_name), dict(c.metrics)) for c in state.checkpoints]

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode``: ``"max"`` or ``"min"``;
        the oldest of equal ones, as Ray), or None when no kept checkpoint reported it."""
        if mode not in ("max", "min"):
            raise TuneConfigError(f"get_best_checkpoint(mode={mode!r}): must be 'max' or 'min'")
        sign = 1.0 if mode == "max" else -1.0
        kept = [(finite_or_none(m.get(metric)), c) for c, m in self.best_checkpoints]
        valid = [(sign * v, -i, c) for i, (v, c) in enumerate(kept) if v is not None]
        return max(valid, key=lambda t: t[:2])[2] if valid else None

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        """Every report of the trial, one row each (pandas)."""
        import pandas as pd

        return pd.DataFrame(list(self._history))

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.metrics.items() if not isinstance(v, (dict, list))}
        err = f", error={self.error.exc_type}" if self.error is not None else ""
        return (
            f"Result({self.trial_name}, {self.status}, metrics={shown!r}, "
            f"config={self.config!r}{err})"
        )


class _TrialResults(Sequence[Result]):
    """The results of a finished sweep's trials, each built when first read (then kept):
    a 10,000-trial grid costs nothing until someone reads it, and what ``len()``,
    counts and ``get_best_result()`` scan is not kept."""

    __slots__ = ("_built", "_filesystem", "_trials")

    def __init__(self, trials: list[LiveTrial], filesystem: AbstractFileSystem) -> None:
        self._trials = trials
        self._filesystem = filesystem
        self._built: dict[int, Result] = {}

    def __len__(self) -> int:
        return len(self._trials)

    @overload
    def __getitem__(self, index: int) -> Result: ...

    @overload
    def __getitem__(self, index: slice) -> list[Result]: ...

    def __getitem__(self, index: int | slice) -> Result | list[Result]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = checked_index(index, len(self), "result")
        result = self._built.get(index)
        if result is None:
            result = Result._of_finished_sweep(self._trials[index], self._filesystem)
            self._built[index] = result
        return result

    def scan(self) -> Iterator[tuple[int, Result]]:
        """``(index, result)`` for every trial, keeping none it had to build."""
        for index, trial in enumerate(self._trials):
            built = self._built.get(index)
            yield (
                index,
                (
                    built
                    if built is not None
                    else Result._of_finished_sweep(trial, self._filesystem)
                ),
            )


class ResultGrid:
    """All trials of a sweep, in trial order.

    Indexable and iterable over :class:`Result`; ``len(grid)`` is the number of trials.

    Example:
        >>> grid = tuner.fit()
        >>> best = grid.get_best_result()            # uses TuneConfig(metric, mode)
        >>> df = grid.get_dataframe()                 # one row per trial
        >>> [r.error for r in grid if r.error]        # what failed, with tracebacks
    """

    def __init__(
        self,
        results: Sequence[Result],
        metric: str | Sequence[str] | None = None,
        mode: str | Sequence[str] | None = None,
        experiment_path: str = "",
    ) -> None:
        self._results: Sequence[Result] = (
            results if isinstance(results, _TrialResults) else list(results)
        )
        self._metric: str | list[str] | None = (
            metric if metric is None or isinstance(metric, str) else list(metric)
        )
        self._mode: str | list[str] | None = (
            mode if mode is None or isinstance(mode, str) else list(mode)
        )
        self.experiment_path = experiment_path

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def _scan(self) -> Iterator[tuple[int, Result]]:
        # Every (index, result), without keeping results a lazy grid builds for it.
        if isinstance(self._results, _TrialResults):
            return self._results.scan()
        return enumerate(self._results)

    @classmethod
    def _of_finished_sweep(
        cls,
        trials: list[LiveTrial],
        filesystem: AbstractFileSystem,
        metric: str | Sequence[str] | None,
        mode: str | Sequence[str] | None,
        experiment_path: str,
    ) -> ResultGrid:
        """The grid of a sweep that is over (``trials`` in order), each result built when
        first read."""
        return cls(_TrialResults(trials, filesystem), metric, mode, experiment_path)

    @property
    def errors(self) -> list[TrialError]:
        """The errors of the trials that failed for good."""
        return [r.error for _, r in self._scan() if r.error is not None]

    @property
    def num_errors(self) -> int:
        """Number of trials that ended with an error."""
        return sum(1 for _, r in self._scan() if r.status == TrialStatus.ERROR.value)

    @property
    def num_terminated(self) -> int:
        """Number of trials that finished (TERMINATED, or PRUNED: ended early by design)."""
        return sum(
            1
            for _, r in self._scan()
            if r.status in (TrialStatus.TERMINATED.value, TrialStatus.PRUNED.value)
        )

    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
        *,
        include_pruned: bool = False,
    ) -> Result:
        """The trial with the best ``metric``, as Ray Tune's ``ResultGrid.get_best_result``.

        Args:
            metric: Defaults to ``TuneConfig(metric=...)`` (single-objective only).
            mode: ``"min"`` or ``"max"``; defaults to ``TuneConfig(mode=...)``.
            scope: Which of a trial's reports count: ``"last"`` (its last value),
                ``"all"`` (its best value ever), ``"avg"`` (the mean of all),
                ``"last-5-avg"`` / ``"last-10-avg"`` (any ``"last-N-avg"``: the mean of
                its last N values).
            filter_nan_and_inf: Skip NaN and infinite values (else infinities count;
                NaN never ranks).
            include_pruned: Also consider pruned trials (their last value is from an
                earlier step than the finished ones').

        Raises:
            TuneConfigError: No metric/mode is known, or mode or scope is invalid.
            TuneError: No trial reported a finite value of the metric.

        Example:
            >>> grid.get_best_result("loss", "min", scope="last-5-avg")
        """
        last_n = scope_window(scope)
        metric, mode = self._metric_and_mode(metric, mode)
        allowed = {TrialStatus.TERMINATED.value}
        if include_pruned:
            allowed.add(TrialStatus.PRUNED.value)
        best: tuple[float, int] | None = None
        for index, r in self._scan():
            if r.status not in allowed:
                continue
            value = scoped_value(
                r.metrics, r._history, metric, mode, scope, last_n, filter_nan_and_inf
            )
            if value is None:
                continue
            score = value if mode == "min" else -value
            if best is None or score < best[0]:
                best = (score, index)
        if best is None:
            raise TuneError(
                f"no finished trial reported a finite value of {metric!r} "
                f"({len(self._results)} trials, {self.num_errors} errors)"
            )
        return self._results[best[1]]

    def _metric_and_mode(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        if metric is None:
            if isinstance(self._metric, list):
                raise TuneConfigError(
                    f"this sweep optimizes several metrics {self._metric}; pass "
                    "get_best_result(metric=..., mode=...) or use get_pareto_front()"
                )
            metric = self._metric
        if mode is None and metric == self._metric and isinstance(self._mode, str):
            mode = self._mode
        if metric is None or mode is None:
            raise TuneConfigError(
                "get_best_result() needs a metric and a mode: pass get_best_result("
                "metric='loss', mode='min') or set TuneConfig(metric=..., mode=...)"
            )
        if mode not in ("min", "max"):
            raise TuneConfigError(f"mode must be 'min' or 'max', got {mode!r}")
        return metric, mode

    def get_pareto_front(self) -> list[Result]:
        """The finished trials no other finished trial beats on every metric (multi-objective)."""
        metrics = self._metric if isinstance(self._metric, list) else [self._metric]
        modes = self._mode if isinstance(self._mode, list) else [self._mode]
        if any(m is None for m in metrics) or any(m is None for m in modes):
            raise TuneConfigError("get_pareto_front() needs TuneConfig(metric=[...], mode=[...])")
        points: list[tuple[list[float], int]] = []
        for index, r in self._scan():
            if r.status != TrialStatus.TERMINATED.value:
                continue
            signed = signed_values(r.metrics, metrics, modes)
            if signed is not None:
                points.append((signed, index))
        return [self._results[i] for i in pareto_front(points)]

    def get_dataframe(self) -> pd.DataFrame:
        """One row per trial: last metrics, ``config/<name>`` columns, status and error.

        With population-based training, ``config/...`` is the trial's final config,
        ``num_exploits`` counts its clones and ``exploits`` lists them
        (``"trial_00002@4"``: it cloned trial 2 at its step 4).
        """
        import pandas as pd

        rows = []
        pbt = any(r.exploits for _, r in self._scan())
        for _, r in self._scan():
            row: dict[str, Any] = {
                "trial_id": r.trial_id,
                "trial_name": r.trial_name,
                "status": r.status,
            }
            for key, value in r.metrics.items():
                if key not in row:
                    row[key] = value
            row.update(flatten(r.config, "config/"))
            if pbt:
                row["num_exploits"] = len(r.exploits)
                row["exploits"] = ", ".join(f"trial_{e.donor:05d}@{e.step}" for e in r.exploits)
            row["path"] = r.path
            row["error"] = (
                f"{r.error.exc_type}: {r.error.error_message}" if r.error is not None else None
            )
            rows.append(row)
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return (
            f"ResultGrid({len(self)} trials, {self.num_terminated} terminated, "
            f"{self.num_errors} errors)"
        )
