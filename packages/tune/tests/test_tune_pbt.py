"""Population-based training without Ray: the decision, the explore step, bad inputs,
and the controller's exploit (clone, relaunch, journal, restore) on a scripted executor."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
from tune_helpers import make_controller

from lumos import tune
from lumos.storage import RunStorage
from lumos.tune._internal.experiment import open_experiment
from lumos.tune._internal.pbt import Member, PopulationBasedTraining
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial import ExploitRecord, TrialStatus
from lumos.tune._internal.trial_journal import decode, encode
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.testing import ScriptedExecutor, Step, report


def pbt(**kwargs: Any) -> PopulationBasedTraining:
    args: dict[str, Any] = {
        "perturbation_interval": 2,
        "hyperparam_mutations": {"lr": tune.uniform(0.0, 1.0)},
        "seed": 0,
    }
    args.update(kwargs)
    return PopulationBasedTraining(**args)


def population(scores: dict[str, float | None], **overrides: Any) -> dict[str, Member]:
    return {
        tid: Member(tid, {"lr": 0.1 * (i + 1)}, score, 0.0, True, False)
        for i, (tid, score) in enumerate(scores.items())
    } | overrides


# -- the decision ----------------------------------------------------------------------


def test_bottom_trial_clones_a_top_trial_with_a_perturbed_config() -> None:
    policy = pbt(resample_probability=0.0)
    pop = population({"a": 1.0, "b": 2.0, "c": 3.0, "d": None})
    decision = policy.decide("d", {"training_iteration": 2, "loss": 9.0}, "loss", "min", pop)
    assert decision.action == "exploit"
    assert decision.donor == "a"  # quantile of 4 trials at 0.25: one at the top
    assert decision.looked
    assert decision.time == 2
    assert decision.score == 9.0
    assert decision.new_config is not None
    factor = decision.new_config["lr"] / 0.1
    assert factor == pytest.approx(1.2) or factor == pytest.approx(0.8)
    assert decision.operations["lr"] in ("* 1.2", "* 0.8")
    assert "cloning trial a" in decision.reason


def test_top_and_middle_trials_continue_and_record_their_look() -> None:
    policy = pbt()
    pop = population({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    top = policy.decide("a", {"training_iteration": 4, "loss": 0.5}, "loss", "min", pop)
    assert top.action == "continue"
    assert "top" in top.reason
    assert top.looked
    middle = policy.decide("b", {"training_iteration": 4, "loss": 2.0}, "loss", "min", pop)
    assert middle.action == "continue"
    assert "middle" in middle.reason


def test_mode_max_ranks_the_other_way() -> None:
    pop = population({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    decision = pbt().decide("a", {"training_iteration": 2, "acc": 0.5}, "acc", "max", pop)
    assert decision.action == "exploit"
    assert decision.donor == "d"


def test_no_look_before_the_interval_or_without_the_metric() -> None:
    pop = population({"a": 1.0, "b": 2.0}) | {"b": Member("b", {"lr": 0.2}, 9.0, 2.0, True)}
    early = pbt().decide("b", {"training_iteration": 3, "loss": 9.0}, "loss", "min", pop)
    assert early.action == "continue"
    assert not early.looked
    assert "interval" in early.reason
    missing = pbt().decide("b", {"training_iteration": 4}, "loss", "min", pop)
    assert missing.action == "continue"
    assert "'loss'" in missing.reason
    burn = pbt(burn_in_period=10).decide(
        "b", {"training_iteration": 4, "loss": 1}, "loss", "min", pop
    )
    assert "burn-in" in burn.reason


def test_a_donor_without_checkpoint_is_not_cloned() -> None:
    pop = population({"a": 1.0, "b": 2.0}) | {"a": Member("a", {"lr": 0.1}, 1.0, 0.0, False)}
    decision = pbt().decide("b", {"training_iteration": 2, "loss": 5.0}, "loss", "min", pop)
    assert decision.action == "continue"
    assert "no checkpoint" in decision.reason
    assert decision.looked


def test_finished_and_nan_trials_are_not_in_the_population() -> None:
    pop = population({"a": 1.0, "b": math.nan, "c": 3.0}) | {
        "a": Member("a", {"lr": 0.1}, 1.0, 0.0, True, finished=True)
    }
    # only c (the reporter) is left: no quantiles
    alone = pbt().decide("c", {"training_iteration": 2, "loss": 3.0}, "loss", "min", pop)
    assert alone.action == "continue"


def test_the_same_seed_gives_the_same_decisions() -> None:
    pop = population({f"t{i}": float(i) for i in range(8)})
    result = {"training_iteration": 2, "loss": 100.0}
    first = [pbt(seed=7).decide("t7", result, "loss", "min", pop) for _ in range(1)]
    again = [pbt(seed=7).decide("t7", result, "loss", "min", pop) for _ in range(1)]
    assert [(d.donor, d.new_config) for d in first] == [(d.donor, d.new_config) for d in again]
    assert first[0].donor in ("t0", "t1")  # ceil(8 * 0.25) = 2 at the top


# -- explore ---------------------------------------------------------------------------


def test_explore_lists_shift_ints_stay_ints_nested_dicts_and_resampling() -> None:
    policy = PopulationBasedTraining(
        perturbation_interval=1,
        hyperparam_mutations={
            "act": ["a", "b", "c"],
            "layers": tune.randint(1, 10),
            "opt": {"lr": tune.loguniform(1e-4, 1e-1)},
        },
        resample_probability=0.0,
        seed=1,
    )
    new, ops = policy.explore({"act": "b", "layers": 5, "opt": {"lr": 0.01}, "keep": 1})
    assert new["act"] in ("a", "c")
    assert ops["act"].startswith("shift")
    assert isinstance(new["layers"], int)
    assert new["layers"] in (4, 6)
    assert new["opt"]["lr"] in (pytest.approx(0.012), pytest.approx(0.008))
    assert new["keep"] == 1
    always = PopulationBasedTraining(
        perturbation_interval=1,
        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "f": lambda: 42},
        resample_probability=1.0,
        seed=1,
    )
    for _ in range(20):
        new, ops = always.explore({"lr": 0.5, "f": 0})
        assert 1e-4 <= new["lr"] <= 1e-1
        assert new["f"] == 42
        assert ops["lr"] == "resample"


# -- bad inputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"quantile_fraction": 0.0}, "quantile_fraction"),
        ({"quantile_fraction": 0.6}, "quantile_fraction"),
        ({"perturbation_interval": 0}, "perturbation_interval"),
        ({"perturbation_interval": -2}, "perturbation_interval"),
        ({"hyperparam_mutations": {}}, "hyperparam_mutations"),
        ({"hyperparam_mutations": {"lr": 3}}, "hyperparam_mutations['lr']"),
        ({"resample_probability": 2}, "resample_probability"),
        ({"perturbation_factors": ()}, "perturbation_factors"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(tune.TuneConfigError, match=field.replace("[", r"\[")):
        pbt(**kwargs)


def test_a_mutation_not_in_param_space_is_a_clear_error() -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", scheduler=pbt())
    with pytest.raises(tune.TuneConfigError, match=r"'lr'.*not in param_space.*\['momentum'\]"):
        tune.Tuner(lambda c: None, param_space={"momentum": tune.uniform(0, 1)}, tune_config=cfg)


def test_scheduler_with_a_pruner_or_without_a_metric_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="pruner=MedianPruner were both given"):
        tune.TuneConfig(
            metric="loss", mode="min", scheduler=pbt(), pruner=optuna.pruners.MedianPruner()
        )
    with pytest.raises(ValueError, match="needs one metric"):
        tune.TuneConfig(scheduler=pbt())
    with pytest.raises(ValueError, match=r"give tune\.PopulationBasedTraining"):
        tune.TuneConfig(metric="loss", mode="min", scheduler="pbt")


# -- the controller executes exploits ------------------------------------------------------


def _script(spec: TrialSpec) -> list[Step]:
    # loss falls faster for a larger lr; every report carries a checkpoint
    start = spec.start_iteration
    lr = spec.config["lr"]
    return [
        report({"loss": 10.0 - lr * (start + i + 1)}, checkpoint=True) for i in range(8 - start)
    ]


def _sweep(tmp_path: Any) -> tuple[Any, ScriptedExecutor]:
    cfg = tune.TuneConfig(
        metric="loss",
        mode="min",
        num_samples=4,
        sampler=optuna.samplers.RandomSampler(seed=0),
        scheduler=pbt(perturbation_interval=2, resample_probability=0.0),
    )
    ex = ScriptedExecutor(_script, storage=RunStorage(str(tmp_path), "exp"))
    return make_controller(
        str(tmp_path), _script, cfg, {"lr": tune.uniform(0.0, 1.0)}, max_concurrent=4, executor=ex
    )


def test_exploited_trials_clone_checkpoint_and_config_and_continue_their_history(
    tmp_path: Any,
) -> None:
    ctl, ex = _sweep(tmp_path)
    trials = ctl.run()
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    exploited = [t for t in trials if t.exploits]
    assert exploited, "no trial was exploited"
    for t in exploited:
        for e in t.exploits:
            assert e.number == t.number
            assert e.donor != t.number
            assert e.checkpoint_dir == f"checkpoint_{e.step:06d}_from_{e.donor:05d}"
            assert e.new_config["lr"] != e.old_config["lr"]
        # the relaunch went on from the clone and kept counting
        relaunches = [s for s in ex.started if s.trial_id == t.trial_id][1:]
        assert [s.start_iteration for s in relaunches] == [e.step for e in t.exploits]
        assert [s.checkpoint_dir for s in relaunches] == [e.checkpoint_dir for e in t.exploits]
        assert [s.config for s in relaunches] == [e.new_config for e in t.exploits]
        assert [r["training_iteration"] for r in t.history] == list(range(1, 9))
        assert t.config == t.exploits[-1].new_config
        assert t.trial_id in ex.kept
    # the clone is a committed checkpoint of the exploited trial
    first = exploited[0].exploits[0]
    state = RunStorage(str(tmp_path), "exp").child(exploited[0].trial_name).load_state()
    assert state is not None
    assert first.checkpoint_dir in [c.dir_name for c in state.checkpoints]
    # the stored experiment keeps every exploit: a restore gives them back
    exp = open_experiment(
        RunStorage(str(tmp_path), "exp"),
        SearchSpace({"lr": tune.uniform(0.0, 1.0)}),
        tune.TuneConfig(metric="loss", mode="min"),
    )
    restored = {t.number: t for t in exp.trials}
    for t in trials:
        assert restored[t.number].exploits == t.exploits
        assert restored[t.number].config == t.config
        assert [r["training_iteration"] for r in restored[t.number].history] == list(range(1, 9))
    exp.close()


def test_exploits_are_in_the_results_dataframe(tmp_path: Any) -> None:
    ctl, _ = _sweep(tmp_path)
    trials = ctl.run()
    from lumos.tune._internal.result import Result, ResultGrid

    grid = ResultGrid([Result.from_trial(t.snapshot(), None) for t in trials], "loss", "min")  # type: ignore[arg-type]
    df = grid.get_dataframe()
    assert df["num_exploits"].sum() == sum(len(t.exploits) for t in trials) > 0
    row = df[df["num_exploits"] > 0].iloc[0]
    assert row["exploits"].startswith("trial_")


def test_exploit_records_round_trip_through_the_journal_format() -> None:
    record = ExploitRecord(3, 1, 4, "checkpoint_000004_from_00001", {"lr": 0.1}, {"lr": 0.2})
    assert decode(encode(record)) == record


# -- the trial side: a report due a look waits for the driver's verdict ----------------------


class _Session:
    """A runtime session stand-in: records emits, answers receive() from a queue."""

    def __init__(self, verdicts: list[str]) -> None:
        self.emitted: list[tuple[Any, ...]] = []
        self.verdicts = verdicts
        self.stop_requested = False

    def emit(self, payload: Any) -> None:
        self.emitted.append(payload)

    def receive(self, timeout_s: float | None = None) -> Any:
        return self.verdicts.pop(0)


def test_a_look_report_waits_and_a_stop_verdict_ends_the_trial_at_once(tmp_path: Any) -> None:
    from lumos.tune._internal.session import GO, STOP, TrialSession
    from lumos.tune._internal.trial_spec import SweepInfo

    sweep = SweepInfo(RunStorage(str(tmp_path), "exp"), pbt_look=("training_iteration", 2.0, 0.0))
    spec = TrialSpec("00000", "trial_00000", {"lr": 0.1})
    runtime = _Session([GO, STOP])
    session = TrialSession(spec, sweep, runtime, str(tmp_path / "exp" / "trial_00000"))
    session.report({"loss": 1.0})  # iteration 1: no look, no wait
    session.report({"loss": 0.9})  # iteration 2: a look; GO
    session.report({"loss": 0.8})  # 3: no look
    with pytest.raises(tune.TrialPruned, match="clones another trial"):
        session.report({"loss": 0.7})  # 4: a look; STOP
    assert [len(p) for p in runtime.emitted] == [3, 4, 3, 4]
    assert runtime.verdicts == []
    assert session.stop_event.is_set()
    # without PBT nothing waits
    plain = _Session([])
    other = TrialSession(spec, SweepInfo(sweep.experiment), plain, str(tmp_path))
    for _ in range(4):
        other.report({"loss": 1.0})
    assert [len(p) for p in plain.emitted] == [3, 3, 3, 3]
