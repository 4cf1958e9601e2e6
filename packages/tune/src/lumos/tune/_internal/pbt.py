"""Population-based training: the decision (which trial clones whom, with which config).

:class:`PopulationBasedTraining` is a pure policy: given the reporting trial's
result and the population's latest scores it returns a :class:`PbtDecision`
(continue, or exploit a donor with a perturbed config) carrying its reason. It
does no I/O and knows nothing of Ray; the controller executes exploits
(``pbt_runner.py``). The semantics follow Ray Tune's ``PopulationBasedTraining``:

- a trial is looked at when ``time_attr`` has advanced by ``perturbation_interval``
  since its last look; its score is then recorded;
- the live trials with a recorded score are ranked; the bottom
  ``quantile_fraction`` clone a random trial of the top ``quantile_fraction``
  (its latest committed checkpoint and its config);
- the cloned config is perturbed: each mutated parameter is resampled with
  probability ``resample_probability``, else multiplied by one of
  ``perturbation_factors`` (a list of values shifts to a neighbour instead).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.sample import Normal
from lumos.tune._internal.search_space import (
    Categorical,
    Domain,
    Float,
    Integer,
    SearchSpace,
)

Mutation = Any  # list | tuple | Domain | Callable[[], Any] | dict[str, Mutation]


@dataclass(frozen=True)
class Member:
    """One trial of the population as PBT sees it.

    Attributes:
        trial_id: The trial's id.
        config: Its current config.
        score: Its metric at its last look (None before its first look).
        last_perturbation_time: ``time_attr`` at its last look (0 before).
        has_checkpoint: Whether it has a committed checkpoint a clone can copy.
        finished: Whether it has ended (finished trials are neither donors nor clones).
    """

    trial_id: str
    config: Mapping[str, Any]
    score: float | None = None
    last_perturbation_time: float = 0.0
    has_checkpoint: bool = False
    finished: bool = False


@dataclass(frozen=True)
class PbtDecision:
    """What PBT decided after one report.

    Attributes:
        trial_id: The reporting trial.
        action: ``"continue"`` or ``"exploit"``.
        reason: Why, in words.
        looked: The interval was reached: record ``score`` and ``time`` as the
            trial's last look (``Member.score`` / ``last_perturbation_time``).
        time: The trial's ``time_attr`` value in this report.
        score: The trial's metric in this report.
        donor: The trial to clone (exploit only).
        new_config: The donor's config, perturbed (exploit only).
        operations: What happened to each mutated parameter (``"* 1.2"``, ``"resample"``).
    """

    trial_id: str
    action: Literal["continue", "exploit"]
    reason: str
    looked: bool = False
    time: float | None = None
    score: float | None = None
    donor: str | None = None
    new_config: dict[str, Any] | None = None
    operations: dict[str, Any] = field(default_factory=dict)


class PopulationBasedTraining:
    """Population-based training (Ray Tune's ``PopulationBasedTraining``), as a scheduler.

    Give it as ``TuneConfig(scheduler=...)``; the metric and mode are
    ``TuneConfig``'s. Every trial must report a checkpoint at least every
    ``perturbation_interval`` (a trial is cloned from its latest committed one) and
    resume from ``tune.get_checkpoint()``. A report that PBT looks at waits for the
    driver's verdict; an exploited trial stops there (``tune.report`` raises
    ``TrialPruned``), gets a copy of the donor's checkpoint as its own newest
    checkpoint and the perturbed config, and starts again on the same actor; its
    ``training_iteration`` continues its own count.

    Args:
        time_attr: The reported attribute that measures progress (increasing).
        perturbation_interval: Look at a trial each time ``time_attr`` advanced this much.
        hyperparam_mutations: Parameter -> how to perturb it: a list of values
            (shift to a neighbour, or resample), a search-space domain
            (``tune.uniform(...)``: multiply by a factor, or resample), a callable
            ``() -> value``, or a dict of these for a nested config. Every name must
            be in ``param_space``.
        quantile_fraction: Fraction of the population at the top and at the bottom,
            in ``(0, 0.5]``.
        resample_probability: Probability of resampling instead of perturbing.
        perturbation_factors: Factors a continuous value is multiplied by.
        burn_in_period: No look before ``time_attr`` reaches this.
        seed: Seed of the random choices (donor, factors, resampling).

    Raises:
        TuneConfigError: A bad argument (the message names it).

    Example:
        >>> pbt = tune.PopulationBasedTraining(
        ...     perturbation_interval=2,
        ...     hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)},
        ...     seed=0,
        ... )
        >>> tune.TuneConfig(metric="loss", mode="min", num_samples=8, scheduler=pbt)
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        perturbation_interval: float = 60.0,
        hyperparam_mutations: Mapping[str, Mutation] | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        burn_in_period: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not isinstance(time_attr, str) or not time_attr:
            raise TuneConfigError(f"PopulationBasedTraining(time_attr={time_attr!r}): give a name")
        if not _positive(perturbation_interval):
            raise TuneConfigError(
                f"PopulationBasedTraining(perturbation_interval={perturbation_interval!r}): "
                "must be a number > 0"
            )
        if not _number(quantile_fraction) or not 0 < quantile_fraction <= 0.5:
            raise TuneConfigError(
                f"PopulationBasedTraining(quantile_fraction={quantile_fraction!r}): must be "
                "in (0, 0.5] (the share of trials at the top and at the bottom)"
            )
        if not _number(resample_probability) or not 0 <= resample_probability <= 1:
            raise TuneConfigError(
                f"PopulationBasedTraining(resample_probability={resample_probability!r}): "
                "must be in [0, 1]"
            )
        factors = tuple(perturbation_factors)
        if not factors or not all(_positive(f) for f in factors):
            raise TuneConfigError(
                f"PopulationBasedTraining(perturbation_factors={perturbation_factors!r}): "
                "give one or more numbers > 0"
            )
        if not _number(burn_in_period) or burn_in_period < 0:
            raise TuneConfigError(
                f"PopulationBasedTraining(burn_in_period={burn_in_period!r}): must be >= 0"
            )
        if not hyperparam_mutations:
            raise TuneConfigError(
                "PopulationBasedTraining(hyperparam_mutations=...) is empty: name at least "
                "one parameter of param_space to perturb"
            )
        _check_mutations(dict(hyperparam_mutations), "")
        self.time_attr = time_attr
        self.perturbation_interval = float(perturbation_interval)
        self.hyperparam_mutations: dict[str, Mutation] = dict(hyperparam_mutations)
        self.quantile_fraction = float(quantile_fraction)
        self.resample_probability = float(resample_probability)
        self.perturbation_factors = factors
        self.burn_in_period = float(burn_in_period)
        self.seed = seed
        self.rng = random.Random(seed)

    # -- validation against the search space ----------------------------------------
    def check_space(self, space: SearchSpace) -> None:
        """Raise if a mutated parameter is not in ``param_space`` (dict spaces only).

        Raises:
            TuneConfigError: The message names the parameter and the space's names.
        """
        if space.define_by_run is not None:
            return  # checked on each config instead (see explore)
        known = _leaf_paths(space.template)
        for path in _mutation_paths(self.hyperparam_mutations, ()):
            if path not in known:
                name = "/".join(path)
                raise TuneConfigError(
                    f"PopulationBasedTraining(hyperparam_mutations) mutates {name!r}, which "
                    f"is not in param_space (its parameters: {sorted('/'.join(p) for p in known)})"
                )

    # -- the decision ---------------------------------------------------------------
    def decide(
        self,
        trial_id: str,
        result: Mapping[str, Any],
        metric: str,
        mode: str,
        population: Mapping[str, Member],
    ) -> PbtDecision:
        """What to do after ``trial_id`` reported ``result``.

        Args:
            trial_id: The reporting trial (a key of ``population``).
            result: Its report.
            metric: The optimized metric.
            mode: ``"min"`` or ``"max"``.
            population: Every trial of the sweep, by id (the reporting one included,
                with its state before this report).

        Returns:
            A :class:`PbtDecision`; its only side effect is on this policy's seeded RNG.
        """
        time = _float(result.get(self.time_attr))
        score = _float(result.get(metric))
        if time is None or score is None:
            missing = self.time_attr if time is None else metric
            return PbtDecision(trial_id, "continue", f"the report has no number {missing!r}")
        if time < self.burn_in_period:
            return PbtDecision(trial_id, "continue", "in the burn-in period")
        me = population[trial_id]
        if time - me.last_perturbation_time < self.perturbation_interval:
            return PbtDecision(trial_id, "continue", "perturbation interval not reached")
        return self._look(trial_id, time, score, mode, population)

    def _look(
        self, trial_id: str, time: float, score: float, mode: str, population: Mapping[str, Member]
    ) -> PbtDecision:
        """The decision once the interval is reached (the look is recorded either way)."""

        def look(action: Literal["continue", "exploit"], reason: str, **kw: Any) -> PbtDecision:
            return PbtDecision(trial_id, action, reason, looked=True, time=time, score=score, **kw)

        signed = -score if mode == "min" else score  # higher is better
        ranked = self._ranked(trial_id, signed, population, mode)
        lower, upper = self._quantiles(ranked)
        if not lower:
            return look("continue", "no other live trial has a score to compare with")
        if trial_id not in lower:
            return look("continue", f"in the {'top' if trial_id in upper else 'middle'}")
        donor_id = self.rng.choice(upper)
        donor = population[donor_id]
        if not donor.has_checkpoint:
            return look("continue", f"in the bottom, but trial {donor_id} has no checkpoint")
        new_config, ops = self.explore(donor.config)
        return look(
            "exploit",
            f"in the bottom {self.quantile_fraction:g} of {len(ranked)} trials "
            f"(score {score:g}); cloning trial {donor_id} (score {donor.score:g})",
            donor=donor_id,
            new_config=new_config,
            operations=ops,
        )

    def _ranked(
        self, trial_id: str, signed: float, population: Mapping[str, Member], mode: str
    ) -> list[tuple[float, str]]:
        ranked: list[tuple[float, str]] = [(signed, trial_id)]
        for tid, m in population.items():
            if tid == trial_id or m.finished or m.score is None or math.isnan(m.score):
                continue
            ranked.append((-m.score if mode == "min" else m.score, tid))
        ranked.sort(key=lambda p: p[0])
        return ranked

    def _quantiles(self, ranked: list[tuple[float, str]]) -> tuple[list[str], list[str]]:
        """(bottom, top) trial ids, as Ray computes them."""
        if len(ranked) <= 1:
            return [], []
        k = math.ceil(len(ranked) * self.quantile_fraction)
        if k > len(ranked) / 2:
            k = math.floor(len(ranked) / 2)
        ids = [tid for _, tid in ranked]
        return ids[:k], ids[-k:]

    def explore(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A perturbed copy of ``config`` and what was done to each mutated parameter.

        Raises:
            TuneConfigError: ``config`` lacks a mutated parameter (define-by-run spaces).
        """
        new = copy.deepcopy(dict(config))
        ops = _explore(new, self.hyperparam_mutations, self, "")
        return new, ops

    def __repr__(self) -> str:
        return (
            f"PopulationBasedTraining(time_attr={self.time_attr!r}, "
            f"perturbation_interval={self.perturbation_interval:g}, "
            f"hyperparam_mutations={list(self.hyperparam_mutations)})"
        )


# -- explore ----------------------------------------------------------------------------


def _explore(
    config: dict[str, Any], mutations: Mapping[str, Mutation], pbt: PopulationBasedTraining, at: str
) -> dict[str, Any]:
    rng = pbt.rng
    ops: dict[str, Any] = {}
    for key, spec in mutations.items():
        name = f"{at}{key}"
        if key not in config:
            raise TuneConfigError(
                f"PopulationBasedTraining mutates {name!r}, but the trial's config has no such "
                f"parameter (it has {sorted(config)})"
            )
        old = config[key]
        if isinstance(spec, Mapping):
            ops[key] = _explore(config[key], spec, pbt, name + "/")
            continue
        if isinstance(spec, (list, tuple)):
            values = list(spec)
            if rng.random() < pbt.resample_probability or old not in values:
                config[key] = rng.choice(values)
                ops[key] = "resample"
            else:
                shift = rng.choice([-1, 1])
                i = values.index(old)
                j = min(max(i + shift, 0), len(values) - 1)
                config[key] = values[j]
                noop = " (noop)" if i == j else ""
                ops[key] = f"shift {'left' if shift == -1 else 'right'}{noop}"
            continue
        if rng.random() < pbt.resample_probability:
            config[key] = _sample(spec, rng)
            ops[key] = "resample"
        else:
            factor = rng.choice(pbt.perturbation_factors)
            config[key] = old * factor
            ops[key] = f"* {factor}"
        if isinstance(old, int) and not isinstance(old, bool):
            config[key] = int(config[key])
    return ops


def _sample(spec: Domain | Callable[[], Any], rng: random.Random) -> Any:
    """Draw a value of a search-space domain (or call a sampling function)."""
    if isinstance(spec, Float):
        if spec.log:
            value = math.exp(rng.uniform(math.log(spec.low), math.log(spec.high)))
        else:
            value = rng.uniform(spec.low, spec.high)
        if spec.q is not None:
            value = min(max(round(value / spec.q) * spec.q, spec.low), spec.high)
        return value
    if isinstance(spec, Normal):
        value = rng.gauss(spec.mean, spec.sd)
        return value if spec.q is None else round(value / spec.q) * spec.q
    if isinstance(spec, Integer):
        if spec.log:
            value = round(math.exp(rng.uniform(math.log(spec.low), math.log(spec.high))))
            return min(max(int(value), spec.low), spec.high)
        return spec.low + spec.q * rng.randrange((spec.high - spec.low) // spec.q + 1)
    if isinstance(spec, Categorical):
        return copy.deepcopy(rng.choice(spec.categories))
    if isinstance(spec, Domain):
        raise TuneConfigError(
            f"PopulationBasedTraining cannot resample {spec!r}: use a tune domain "
            "(tune.uniform, tune.choice, ...), a list or a function"
        )
    return spec()


def _check_mutations(mutations: Mapping[str, Any], at: str) -> None:
    for key, spec in mutations.items():
        name = f"{at}{key}"
        if not isinstance(key, str):
            raise TuneConfigError(f"hyperparam_mutations keys must be strings, got {key!r}")
        if isinstance(spec, Mapping):
            _check_mutations(spec, name + "/")
        elif isinstance(spec, (list, tuple)):
            if not spec:
                raise TuneConfigError(f"hyperparam_mutations[{name!r}] is an empty list")
        elif isinstance(spec, (Float, Integer, Categorical, Normal)):
            continue
        elif isinstance(spec, Domain) or not callable(spec):
            raise TuneConfigError(
                f"hyperparam_mutations[{name!r}]={spec!r}: give a list of values, a tune "
                "domain (tune.uniform, tune.loguniform, tune.choice, tune.randint, ...), a "
                "function () -> value, or a dict of these"
            )


def _mutation_paths(mutations: Mapping[str, Any], at: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, spec in mutations.items():
        if isinstance(spec, Mapping):
            out.extend(_mutation_paths(spec, (*at, key)))
        else:
            out.append((*at, key))
    return out


def _leaf_paths(template: Any, at: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    if isinstance(template, Mapping):
        for key, value in template.items():
            out.add((*at, key))
            out |= _leaf_paths(value, (*at, key))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _float(value: Any) -> float | None:
    if not _number(value):
        return None
    return float(value)
