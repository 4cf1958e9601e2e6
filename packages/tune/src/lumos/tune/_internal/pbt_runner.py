"""The driver side of population-based training: keeps PBT's per-trial state and
carries out exploits.

:class:`PbtRunner` asks the pure :class:`~lumos.tune._internal.pbt.PopulationBasedTraining`
for a decision after each report and remembers each trial's last look (score and
time). When the controller has stopped an exploited trial, :meth:`PbtRunner.execute`
copies the donor's latest committed checkpoint into the trial's directory and
commits it there, as the trial's newest checkpoint, before the exploit is
journaled: the run state is the truth (the committed copy carries the exploit, so a
driver that dies between the two steps loses nothing, see
:func:`exploit_from_checkpoint`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lumos.storage import (
    CheckpointRecord,
    RetentionPolicy,
    RunState,
    RunStorage,
    retried_copy_tree,
    retried_rm,
    to_jsonable,
)
from lumos.tune._internal import messages
from lumos.tune._internal.config import TuneConfig
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.pbt import Member, PbtDecision, PopulationBasedTraining
from lumos.tune._internal.session import ITERATION_KEY
from lumos.tune._internal.trial import ExploitRecord

logger = logging.getLogger("lumos.tune")

#: Key of the cloned checkpoint's metrics that records the exploit (see module docstring).
EXPLOIT_KEY = "pbt_exploit"


@dataclass
class _Look:
    score: float | None = None
    time: float = 0.0


class PbtRunner:
    """Population-based training in the driver.

    Args:
        policy: The decision object.
        storage: The experiment's storage (trial directories are its children).
        metric: The optimized metric; mode: ``"min"`` or ``"max"``.
        retention: Checkpoint retention applied when the clone is committed.
        trials: The trials known at start (a restored experiment's included).
    """

    def __init__(
        self,
        policy: PopulationBasedTraining,
        storage: RunStorage,
        metric: str,
        mode: str,
        retention: RetentionPolicy | None = None,
        trials: Sequence[LiveTrial] = (),
    ) -> None:
        self.policy = policy
        self.storage = storage
        self.metric = metric
        self.mode = mode
        self.retention = retention
        self.looks: dict[str, _Look] = {}
        self.pending: dict[str, PbtDecision] = {}
        for trial in trials:
            self.looks[trial.trial_id] = _Look(time=self._restored_time(trial))

    @classmethod
    def for_config(
        cls,
        tune_config: TuneConfig,
        storage: RunStorage,
        retention: RetentionPolicy | None,
        trials: Sequence[LiveTrial],
    ) -> PbtRunner | None:
        """The runner of ``TuneConfig(scheduler=PopulationBasedTraining(...))``, else None."""
        if tune_config.scheduler is None:
            return None
        metric, mode = tune_config.metrics[0], tune_config.modes[0]
        return cls(tune_config.scheduler, storage, metric, mode, retention, trials)

    def _restored_time(self, trial: LiveTrial) -> float:
        """When a restored trial was last looked at: its last look before it stopped."""
        interval = self.policy.perturbation_interval
        value = trial.history[-1].get(self.policy.time_attr) if trial.history else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return 0.0
        return math.floor(float(value) / interval) * interval

    # -- decide -------------------------------------------------------------------------
    def after_report(
        self, trial: LiveTrial, metrics: Mapping[str, Any], trials: Sequence[LiveTrial]
    ) -> PbtDecision | None:
        """The exploit decision for ``trial`` (kept until :meth:`execute`), or None."""
        look = self.looks.setdefault(trial.trial_id, _Look())
        interval = self.policy.perturbation_interval
        t = metrics.get(self.policy.time_attr)
        if isinstance(t, (int, float)) and float(t) - look.time < interval:
            return None  # the common case, without building the population
        population = {
            t.trial_id: self._member(t) for t in trials if t.trial_id in self.looks or t is trial
        }
        decision = self.policy.decide(trial.trial_id, metrics, self.metric, self.mode, population)
        if decision.looked and decision.time is not None:
            look.time = decision.time
            look.score = decision.score
        logger.debug("pbt: trial %s: %s", trial.trial_name, decision.reason)
        if decision.action != "exploit":
            return None
        self.pending[trial.trial_id] = decision
        return decision

    def _member(self, trial: LiveTrial) -> Member:
        look = self.looks.get(trial.trial_id, _Look())
        return Member(
            trial_id=trial.trial_id,
            config=trial.config,
            score=look.score,
            last_perturbation_time=look.time,
            has_checkpoint=trial.checkpoint_dir is not None,
            finished=trial.status.is_finished,
        )

    def last_look(self, trial_id: str) -> float:
        """``time_attr`` at the trial's last look (0 before its first)."""
        look = self.looks.get(trial_id)
        return look.time if look is not None else 0.0

    def drop(self, trial_id: str) -> None:
        """Forget a pending exploit (the trial ended or failed before it stopped)."""
        self.pending.pop(trial_id, None)

    # -- execute ------------------------------------------------------------------------
    def execute(self, trial: LiveTrial, by_id: Mapping[str, LiveTrial]) -> ExploitRecord | None:
        """Clone the donor into the stopped ``trial``: copy and commit its checkpoint,
        give ``trial`` the new config. Returns the record to journal, or None when the
        donor has no committed checkpoint any more (the trial goes on unchanged)."""
        decision = self.pending.pop(trial.trial_id)
        assert decision.donor is not None
        assert decision.new_config is not None
        donor = by_id[decision.donor]
        step = trial.iteration
        dir_name = f"checkpoint_{step:06d}_from_{donor.trial_id}"
        extra = {
            "donor": donor.number,
            "config": to_jsonable(decision.new_config),
            "old_config": to_jsonable(trial.config),
            "ops": to_jsonable(decision.operations),
        }
        copied = self._clone(donor, trial, dir_name, step, extra)
        if copied is None:
            logger.warning(messages.pbt_no_checkpoint(donor.trial_name, trial.trial_name))
            return None
        record = ExploitRecord(
            number=trial.number,
            donor=donor.number,
            step=step,
            checkpoint_dir=dir_name,
            old_config=to_jsonable(trial.config),
            new_config=dict(decision.new_config),
            operations=dict(decision.operations),
            donor_checkpoint=copied,
        )
        apply_exploit(trial, record)
        logger.info(
            messages.pbt_cloned(
                trial.trial_name, donor.trial_name, step, decision.reason, decision.new_config
            )
        )
        return record

    def _clone(
        self, donor: LiveTrial, trial: LiveTrial, dir_name: str, step: int, extra: dict[str, Any]
    ) -> str | None:
        donor_storage = self.storage.child(donor.dir_name)
        trial_storage = self.storage.child(trial.dir_name)
        fs = trial_storage.fs
        dest = trial_storage.checkpoint_path(dir_name)
        for _ in range(3):  # the donor's retention may delete what we read: read again
            latest = _donor_latest(donor, donor_storage)
            if latest is None:
                return None
            retried_rm(fs, dest, recursive=True)  # a clone an earlier try left part-way
            latest_dir, latest_metrics = latest
            try:
                retried_copy_tree(fs, f"{donor_storage.run_path}/{latest_dir}", dest)
            except FileNotFoundError:
                continue
            metrics = dict(latest_metrics)
            metrics[ITERATION_KEY] = step
            metrics[EXPLOIT_KEY] = extra
            own = trial_storage.load_state() or RunState(name=trial.dir_name)
            record = CheckpointRecord(
                dir_name=dir_name, metrics=metrics, report_index=step, created_at=time.time()
            )
            trial_storage.commit_checkpoint(own, record, self.retention)
            return latest_dir
        return None


def _donor_latest(donor: LiveTrial, donor_storage: RunStorage) -> tuple[str, dict[str, Any]] | None:
    """``(path in the donor's directory, metrics)`` of the donor's latest committed
    checkpoint: its own (``tune.report``), or the one a Train run inside it committed
    (``train/checkpoint_000004``: the trial's checkpoint names that run's directory; the
    Train run's state, not the trial's, keeps it)."""
    nested = donor.checkpoint_dir
    if nested is not None and "/" in nested:
        it = donor.checkpoint_iteration
        row = next((r for r in donor.history if r.get(ITERATION_KEY) == it), {})
        return nested, dict(row)
    state = donor_storage.load_state()
    latest = state.latest() if state is not None else None
    return (latest.dir_name, dict(latest.metrics)) if latest is not None else None


def apply_exploit(trial: LiveTrial, record: ExploitRecord) -> None:
    """Give ``trial`` the exploit's config and cloned checkpoint (live or restored)."""
    trial.config = dict(record.new_config)
    trial.checkpoint_dir = record.checkpoint_dir
    trial.checkpoint_iteration = record.step
    trial.exploits = [*trial.exploits, record]


def exploit_from_checkpoint(trial: LiveTrial, latest: CheckpointRecord) -> ExploitRecord | None:
    """The exploit a committed clone records, when the journal missed it (driver crash).

    Returns None when ``latest`` is not a clone or its exploit is already known.
    """
    extra = latest.metrics.get(EXPLOIT_KEY)
    if not isinstance(extra, dict):
        return None
    if any(e.checkpoint_dir == latest.dir_name for e in trial.exploits):
        return None
    return ExploitRecord(
        number=trial.number,
        donor=int(extra.get("donor", -1)),
        step=latest.report_index,
        checkpoint_dir=latest.dir_name,
        old_config=dict(extra.get("old_config") or {}),
        new_config=dict(extra.get("config") or {}),
        operations=dict(extra.get("ops") or {}),
    )
