"""Ray Tune's spellings on top of Optuna: schedulers -> pruners, OptunaSearch,
ConcurrencyLimiter, RunConfig(stop=...); unsupported Ray searchers are clear errors."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from tune_helpers import make_controller

from lumos import tune
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
)
from lumos.tune.search import ConcurrencyLimiter
from lumos.tune.search.optuna import OptunaSearch
from lumos.tune.testing import Step, report


def test_schedulers_become_the_matching_optuna_pruners() -> None:
    asha = tune.TuneConfig(
        metric="loss",
        mode="min",
        scheduler=ASHAScheduler(max_t=20, grace_period=2, reduction_factor=3),
    )
    assert isinstance(asha.pruner, optuna.pruners.SuccessiveHalvingPruner)
    assert asha.pruner._min_resource == 2
    assert asha.pruner._reduction_factor == 3
    assert asha.stop == {"training_iteration": 20}  # ASHA stops trials at max_t
    assert asha.scheduler is None
    assert ASHAScheduler is AsyncHyperBandScheduler
    hb = tune.TuneConfig(metric="loss", mode="min", scheduler=HyperBandScheduler(max_t=27))
    assert isinstance(hb.pruner, optuna.pruners.HyperbandPruner)
    assert hb.pruner._max_resource == 27
    med = tune.TuneConfig(metric="loss", mode="min", scheduler=MedianStoppingRule(grace_period=3))
    assert isinstance(med.pruner, optuna.pruners.MedianPruner)
    assert med.pruner._n_warmup_steps == 3
    fifo = tune.TuneConfig(metric="loss", mode="min", scheduler=FIFOScheduler())
    assert isinstance(fifo.pruner, optuna.pruners.NopPruner)
    # metric / mode given to the scheduler, as Ray users do
    filled = tune.TuneConfig(scheduler=ASHAScheduler(metric="acc", mode="max"))
    assert (filled.metric, filled.mode) == ("acc", "max")
    assert PopulationBasedTraining is tune.PopulationBasedTraining


def test_bad_scheduler_arguments_are_clear_errors() -> None:
    with pytest.raises(tune.TuneConfigError, match="time_attr='training_iteration'"):
        ASHAScheduler(time_attr="time_total_s")
    with pytest.raises(tune.TuneConfigError, match="grace_period"):
        ASHAScheduler(max_t=2, grace_period=5)
    with pytest.raises(ValueError, match="both set pruner"):
        tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(),
            pruner=optuna.pruners.MedianPruner(),
        )
    with pytest.raises(ValueError, match="disagree"):
        tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(mode="max"))


def test_optuna_search_and_concurrency_limiter() -> None:
    sampler = optuna.samplers.RandomSampler(seed=0)
    cfg = tune.TuneConfig(
        metric="loss",
        mode="min",
        search_alg=ConcurrencyLimiter(
            OptunaSearch(sampler=sampler, points_to_evaluate=[{"x": 0.5}]), max_concurrent=3
        ),
    )
    assert cfg.sampler is sampler
    assert cfg.max_concurrent_trials == 3
    assert cfg.points_to_evaluate == [{"x": 0.5}]
    seeded = tune.TuneConfig(metric="loss", mode="min", search_alg=OptunaSearch(seed=3))
    assert isinstance(seeded.sampler, optuna.samplers.TPESampler)

    def space(trial: optuna.Trial) -> dict[str, Any]:
        return {"x": trial.suggest_float("x", 0, 1)}

    tuner = tune.Tuner(
        lambda config: None,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", search_alg=ConcurrencyLimiter(OptunaSearch(space), 2)
        ),
    )
    assert tuner.space.define_by_run is space


def test_a_ray_searcher_lumos_cannot_run_names_the_sampler_to_use() -> None:
    class HyperOptSearch:  # stands for ray.tune.search.hyperopt.HyperOptSearch
        pass

    with pytest.raises(ValueError, match=r"sampler=optuna\.samplers\.TPESampler"):
        tune.TuneConfig(metric="loss", mode="min", search_alg=HyperOptSearch())


def test_run_config_stop_where_ray_puts_it() -> None:
    tuner = tune.Tuner(
        lambda config: None,
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(stop={"training_iteration": 3}, verbose=0),
    )
    assert tuner.tune_config.stop == {"training_iteration": 3}
    both = tune.Tuner(
        lambda config: None,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", scheduler=ASHAScheduler(max_t=10), stop={"loss": 0.5}
        ),
        run_config=tune.RunConfig(stop={"training_iteration": 3, "acc": 0.9}),
    )
    # both apply, as in Ray: the earlier bound of a metric wins
    assert both.tune_config.stop == {"training_iteration": 3, "loss": 0.5, "acc": 0.9}


def _curve(spec: TrialSpec) -> list[Step]:
    bad = spec.trial_id in ("00002", "00003")
    return [report({"loss": 10.0 if bad else 1.0 / (i + 1)}) for i in range(8)]


def test_asha_prunes_and_stops_at_max_t_in_a_sweep(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=4,
        scheduler=ASHAScheduler(max_t=6, grace_period=1, reduction_factor=2),
    )
    ctl, _ = make_controller(str(tmp_path), _curve, cfg, {"x": tune.uniform(0, 1)})
    trials = ctl.run()
    assert [t.status for t in trials[2:]] == [TrialStatus.PRUNED] * 2
    assert all(t.iteration <= 6 for t in trials)
    assert trials[0].status is TrialStatus.TERMINATED
    assert trials[0].iteration == 6


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: tune.TuneConfig(num_sample=3),
            r"no field 'num_sample'; did you mean 'num_samples'",
        ),
        (lambda: tune.TuneConfig(storage_path="x"), r"belongs in RunConfig\(storage_path=...\)"),
        (lambda: tune.RunConfig(reuse_actors=True), r"belongs in TuneConfig\(reuse_actors"),
        (lambda: tune.RunConfig(metric="loss"), r"belongs in TuneConfig\(metric=...\)"),
        (lambda: tune.RunConfig(progress_reporter=None), "verbose"),
        (lambda: tune.RunConfig(nmae="x"), r"did you mean 'name'"),
    ],
)
def test_unknown_fields_name_the_field_and_the_way_out(make: Any, message: str) -> None:
    with pytest.raises(tune.TuneConfigError, match=message):
        make()
