"""What a trial attempt is given: its :class:`TrialSpec`, the sweep's :class:`SweepInfo`,
and the user's view of both (:class:`TrialContext`, from ``tune.get_context()``).

Both records are pickled to the trial's actor (``TrialSpec`` at every launch,
``SweepInfo`` once with the trial function), so they stay small and import nothing
heavy: a fresh actor should not import optuna.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lumos.storage import RetentionPolicy, RunStorage


@dataclass(frozen=True)
class TrialSpec:
    """What changes per trial attempt (small: it is pickled for every launch).

    Attributes:
        trial_id: Short id (``"00007"``).
        trial_name: Name of the trial (``"trial_00007"``, or ``trial_name_creator``'s).
        config: The sampled config.
        attempt: 0 for the first run, 1 for the first retry, ...
        checkpoint_dir: Latest committed checkpoint of the trial, if any.
        start_iteration: Reports already counted (the checkpoint's iteration).
        dir_name: The trial's directory in the experiment (default: ``trial_name``).
        pbt_last_look: Population-based training: ``time_attr`` at the trial's last look.
        nested_run_name: The run name a Train run in the trial gets by default: ``train``,
            then ``train-pbt<k>`` after the trial's k-th exploit (a fresh run that starts
            from the cloned checkpoint instead of resuming its own state).
        resources: The trial's own Ray resources (``with_resources(trainable, fn)``);
            ``None``: the sweep's.
    """

    trial_id: str
    trial_name: str
    config: dict[str, Any]
    attempt: int = 0
    checkpoint_dir: str | None = None
    start_iteration: int = 0
    dir_name: str = ""
    pbt_last_look: float = 0.0
    nested_run_name: str = "train"
    resources: dict[str, float] | None = None

    @property
    def directory(self) -> str:
        """The trial's directory name in the experiment."""
        return self.dir_name or self.trial_name


@dataclass(frozen=True)
class SweepInfo:
    """What every trial of a sweep shares (shipped once, with the trial function).

    Attributes:
        experiment: The experiment's storage.
        retention: Checkpoint retention for each trial.
        metric: The optimized metric when there is exactly one (a returned number reports it).
        resources: Each trial's Ray resources (a hint for nested jobs).
        pbt_look: Population-based training's ``(time_attr, perturbation_interval,
            burn_in_period)``: a report that is due a look waits for the driver's
            verdict (go on, or stop at once to be cloned), so no step is wasted.
        stop: ``TuneConfig(stop={...})`` bounds: a trial that reaches one stops at its
            next report (and a ``tune.Trainable`` right away), as the driver would
            decide, without waiting for the driver's stop request.
        judge_reports: The driver judges every report (a pruner, a stopper object or
            function): a trial reads the verdict on a report at its next one, so the
            first report that meets a criterion is the trial's last.
        checkpoint_frequency: ``CheckpointConfig(checkpoint_frequency=...)`` for
            ``tune.Trainable`` classes (0: the class decides).
        checkpoint_at_end: ``CheckpointConfig(checkpoint_at_end=...)``.
    """

    experiment: RunStorage
    retention: RetentionPolicy | None = None
    metric: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    pbt_look: tuple[str, float, float] | None = None
    stop: dict[str, float] | None = None
    judge_reports: bool = False
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None


class TrialContext:
    """Where the current trial runs; returned by :func:`lumos.tune.get_context`.

    Example:
        >>> def objective(config):
        ...     ctx = tune.get_context()
        ...     print(ctx.get_trial_name(), ctx.get_trial_dir())
    """

    def __init__(self, spec: TrialSpec, sweep: SweepInfo, trial_uri: str) -> None:
        self._spec = spec
        self._sweep = sweep
        self._uri = trial_uri
        self._storage: RunStorage | None = None

    def get_trial_id(self) -> str:
        """The trial's id (``"00007"``)."""
        return self._spec.trial_id

    def get_trial_name(self) -> str:
        """The trial's name (``"trial_00007"``, or what ``trial_name_creator`` returned)."""
        return self._spec.trial_name

    def get_trial_dir(self) -> str:
        """URL (or local path) of the trial's directory in the experiment."""
        return self._uri

    def get_experiment_name(self) -> str:
        """The experiment's name (``RunConfig.name``)."""
        return self._sweep.experiment.name

    def get_storage(self) -> RunStorage:
        """The trial's storage (``lumos.storage.RunStorage`` of the trial directory)."""
        if self._storage is None:
            self._storage = self._sweep.experiment.child(self._spec.directory)
        return self._storage

    def get_trial_resources(self) -> dict[str, float]:
        """The Ray resources the trial's actor reserved."""
        own = self._spec.resources
        return dict(own if own is not None else self._sweep.resources)

    def get_attempt(self) -> int:
        """0 for the first run of the trial, 1 for its first retry, ..."""
        return self._spec.attempt
