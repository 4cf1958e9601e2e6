"""Where a sweep's new trials come from: the study's ask, each sampled, named and journaled.

Trials enqueued before a restore come first, then the next grid point (each grid
point is enqueued with its index, so a restore knows where the grid stopped), then
the sampler's own. ``TuneConfig(num_samples=...)`` (times the grid points) bounds them.
"""

from __future__ import annotations

from optuna.trial import TrialState

from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.experiment import GRID_ATTR, Experiment
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial_rules import TrialNames


class TrialSource:
    """Makes the sweep's new trials (see the module docstring).

    Args:
        experiment: Asked for new trials (its study), told their names (its trial
            journal); its restored trials count towards ``num_samples``.
        space: Samples each new trial's config; its grid points are enqueued first.
        tune_config: ``num_samples`` and the trial name creators.
        trainable_name: Given to every new trial (``Trial.trainable_name``).
    """

    def __init__(
        self,
        experiment: Experiment,
        space: SearchSpace,
        tune_config: TuneConfig,
        trainable_name: str = "",
    ) -> None:
        self.exp = experiment
        self.space = space
        self.trainable_name = trainable_name
        self.names = TrialNames(tune_config, {t.dir_name for t in experiment.trials})
        n = tune_config.num_samples
        self._target = -1 if n == -1 else n * space.num_grid_points
        self._created = len(experiment.trials)
        self._trials_uri = experiment.storage.uri.rstrip("/")

    @property
    def exhausted(self) -> bool:
        """Whether the sweep has all the trials it asks for."""
        return self._target != -1 and self._created >= self._target

    def next(self) -> LiveTrial:
        """Ask the study for a new trial and sample its config (a failed sample fails it)."""
        study = self.exp.study
        if self.exp.waiting > 0:
            self.exp.waiting -= 1
        elif self.space.grid:
            index = self.exp.grid_next
            self.exp.grid_next += 1
            study.enqueue_trial(self.space.grid_params(index), user_attrs={GRID_ATTR: index})
        ot = study.ask()
        try:
            config = self.space.sample(ot)
        except BaseException:
            study.tell(ot, state=TrialState.FAIL)
            raise
        self._created += 1
        path = f"{self._trials_uri}/trial_{ot.number:05d}"  # == storage.child(name).uri
        trial = LiveTrial.new(ot, config, path, self.trainable_name)
        names = self.names.name(trial)
        if names is not None:
            trial.path = self.exp.storage.child(trial.dir_name).uri
            self.exp.trials_journal.append(names)
        return trial
