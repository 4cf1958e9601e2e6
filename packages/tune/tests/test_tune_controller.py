"""The trial scheduler logic on a scripted executor: concurrency, pruning, stops, retries."""

from __future__ import annotations

import uuid
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from tune_helpers import FakeClock, RecordingProgress, make_controller

from lumos import tune
from lumos.tune._internal.experiment import open_experiment
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.result import Result
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.trial import TrialStatus
from lumos.tune._internal.trial_journal import EndRecord, TrialJournal
from lumos.tune._internal.trial_spec import TrialSpec
from lumos.tune.testing import ScriptedExecutor, Step, die, fail, hang, report


def curve(spec: TrialSpec, steps: int = 5) -> list[Step]:
    x = spec.config["x"]
    return [report({"loss": (x - 2.0) ** 2 + 1.0 / (i + 1)}) for i in range(steps)]


def test_runs_num_samples_trials_within_the_concurrency_limit(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(
        metric="loss", mode="min", num_samples=10, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    ctl, ex = make_controller(
        str(tmp_path), curve, cfg, {"x": tune.uniform(-5, 5)}, max_concurrent=3
    )
    trials = ctl.run()
    assert len(trials) == 10
    assert len(ex.started) == 10
    assert ex.max_running == 3
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    assert all(t.iteration == 5 and len(t.history) == 5 for t in trials)
    study = ctl.study
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 10
    # the study's value is the last reported metric
    for t, frozen in zip(trials, study.trials):
        assert frozen.value == pytest.approx(t.last_result["loss"])
        assert frozen.params["x"] == pytest.approx(t.config["x"])


def test_pruner_decision_ends_the_trial_at_its_next_report(tmp_path: Any) -> None:
    # ThresholdPruner prunes any trial whose loss goes above 5 (deterministic).
    cfg = tune.TuneConfig(
        metric="loss", mode="min", num_samples=2, pruner=optuna.pruners.ThresholdPruner(upper=5.0)
    )

    def script(spec: TrialSpec) -> list[Step]:
        bad = spec.trial_id == "00001"
        return [report({"loss": 10.0 if bad else 1.0}) for _ in range(6)]

    ctl, ex = make_controller(str(tmp_path), script, cfg, {"x": tune.uniform(0, 1)})
    trials = ctl.run()
    good, bad = trials
    assert good.status is TrialStatus.TERMINATED
    assert good.iteration == 6
    assert bad.status is TrialStatus.PRUNED
    assert bad.iteration == 1  # pruned after the first report; the next one raised
    assert ex.stopped == ["00001"]
    assert [t.state for t in ctl.study.trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert ctl.study.trials[1].intermediate_values == {1: 10.0}


def test_successive_halving_uses_fewer_iterations_and_keeps_the_best(tmp_path: Any) -> None:
    def run(pruner: optuna.pruners.BasePruner | None, name: str) -> tuple[int, float]:
        cfg = tune.TuneConfig(
            metric="loss",
            mode="min",
            num_samples=16,
            pruner=pruner,
            sampler=optuna.samplers.RandomSampler(seed=3),
        )
        ctl, _ = make_controller(
            str(tmp_path),
            lambda s: curve(s, 9),
            cfg,
            {"x": tune.uniform(-5, 5)},
            name=name,
            max_concurrent=1,
        )
        trials = ctl.run()
        best = min(t.last_result["loss"] for t in trials if t.status is TrialStatus.TERMINATED)
        return sum(t.iteration for t in trials), best

    full_iters, full_best = run(None, "nopruner")
    sh_iters, sh_best = run(optuna.pruners.SuccessiveHalvingPruner(), "sha")
    assert sh_iters < full_iters
    assert sh_best == pytest.approx(full_best)


def test_stop_dict_ends_trials_as_terminated(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=3, stop={"training_iteration": 3})
    ctl, ex = make_controller(str(tmp_path), lambda s: curve(s, 10), cfg, {"x": tune.uniform(0, 1)})
    trials = ctl.run()
    assert all(t.status is TrialStatus.TERMINATED and t.iteration == 3 for t in trials)
    assert sorted(ex.stopped) == ["00000", "00001", "00002"]
    assert all(t.state is TrialState.COMPLETE for t in ctl.study.trials)


def test_stop_callable_sees_trial_id_and_result(tmp_path: Any) -> None:
    seen: list[tuple[str, int]] = []

    def stop(trial_id: str, result: dict[str, Any]) -> bool:
        seen.append((trial_id, result["training_iteration"]))
        return result["loss"] < 0.5

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1, stop=stop)
    ctl, _ = make_controller(
        str(tmp_path), lambda s: [report({"loss": v}) for v in (2.0, 1.0, 0.4, 0.3, 0.2)], cfg
    )
    (trial,) = ctl.run()
    assert trial.iteration == 3
    assert trial.last_result["loss"] == 0.4
    assert seen == [("00000", 1), ("00000", 2), ("00000", 3)]


def test_failed_trial_is_retried_from_its_last_checkpoint(tmp_path: Any) -> None:
    def script(spec: TrialSpec) -> list[Step]:
        if spec.attempt == 0:
            return [
                report({"loss": 3.0}),
                report({"loss": 2.0}, checkpoint=True),
                report({"loss": 1.5}),
                fail("flaky"),
            ]
        return [report({"loss": 1.0}), report({"loss": 0.5})]

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1)
    ctl, ex = make_controller(str(tmp_path), script, cfg, max_failures=1)
    (trial,) = ctl.run()
    assert trial.status is TrialStatus.TERMINATED
    first, retry = ex.started
    assert (first.attempt, first.checkpoint_dir) == (0, None)
    assert (retry.attempt, retry.checkpoint_dir, retry.start_iteration) == (
        1,
        "checkpoint_000002",
        2,
    )
    # the history keeps the reports up to the checkpoint, then the retry's
    assert [r["training_iteration"] for r in trial.history] == [1, 2, 3, 4]
    assert [r["loss"] for r in trial.history] == [3.0, 2.0, 1.0, 0.5]
    assert len(trial.errors) == 1
    assert trial.errors[0].error_message == "flaky"
    assert trial.error is None
    assert ctl.study.trials[0].value == 0.5


def test_errors_beyond_max_failures_end_the_trial_and_the_sweep_goes_on(tmp_path: Any) -> None:
    def script(spec: TrialSpec) -> list[Step]:
        if spec.trial_id == "00000":
            return [report({"loss": 1.0}), fail(f"attempt {spec.attempt}")]
        return [report({"loss": 2.0})]

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=3)
    progress = RecordingProgress()
    ctl, ex = make_controller(str(tmp_path), script, cfg, max_failures=2, progress=progress)
    trials = ctl.run()
    assert [t.status for t in trials] == [
        TrialStatus.ERROR,
        TrialStatus.TERMINATED,
        TrialStatus.TERMINATED,
    ]
    failed = trials[0]
    assert [e.error_message for e in failed.errors] == ["attempt 0", "attempt 1", "attempt 2"]
    assert failed.error is failed.errors[-1]
    assert sum(1 for s in ex.started if s.trial_id == "00000") == 3
    assert ctl.study.trials[0].state is TrialState.FAIL
    assert sorted(progress.done) == ["trial_00000", "trial_00001", "trial_00002"]


def test_dead_actor_counts_as_a_failure_and_is_retried(tmp_path: Any) -> None:
    def script(spec: TrialSpec) -> list[Step]:
        return [die()] if spec.attempt == 0 else [report({"loss": 1.0})]

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1)
    ctl, _ex = make_controller(str(tmp_path), script, cfg, max_failures=-1)
    (trial,) = ctl.run()
    assert trial.status is TrialStatus.TERMINATED
    assert trial.errors[0].exc_type == "WorkerDied"


def _one_bad_trial(spec: TrialSpec) -> list[Step]:
    if spec.trial_id == "00001":
        return [fail("bad config")]
    return [report({"loss": 1.0}) for _ in range(50)]


def test_fail_fast_raise_stops_the_sweep_and_raises(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=10, fail_fast="raise")
    ctl, ex = make_controller(str(tmp_path), _one_bad_trial, cfg)
    with pytest.raises(tune.TuneFailedError, match="fail_fast='raise'") as info:
        ctl.run()
    assert [e.error_message for e in info.value.errors] == ["bad config"]
    assert len(ex.started) == 2  # nothing new started after the failure
    assert "00000" in ex.stopped  # the other running trial was asked to stop


def test_fail_fast_true_stops_the_sweep_and_returns(tmp_path: Any) -> None:
    # Ray's split: fail_fast=True ends the sweep; fit() returns the grid with the error.
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=10, fail_fast=True)
    ctl, ex = make_controller(str(tmp_path), _one_bad_trial, cfg)
    trials = ctl.run()
    assert len(ex.started) == 2  # nothing new started after the failure
    assert "00000" in ex.stopped
    by_id = {t.trial_id: t for t in trials}
    assert by_id["00001"].status is TrialStatus.ERROR
    assert by_id["00001"].errors[0].error_message == "bad config"
    assert by_id["00000"].status is TrialStatus.TERMINATED


def test_metric_never_reported_is_a_clear_error(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=4)
    ctl, _ = make_controller(str(tmp_path), lambda s: [report({"acc": 0.9})], cfg)
    with pytest.raises(
        tune.MetricNotReportedError, match=r"without reporting the metric 'loss'.*'acc'"
    ):
        ctl.run()
    assert ctl.trials[0].status is TrialStatus.ERROR


def test_time_budget_with_unbounded_num_samples(tmp_path: Any) -> None:
    clock = FakeClock()

    class TickingExecutor(ScriptedExecutor):
        def poll(self, timeout_s: float | None) -> list[Any]:
            clock.now += 1.0
            return super().poll(timeout_s)

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=-1, time_budget_s=10)
    ex = TickingExecutor(lambda s: curve(s, 4))
    ctl, _ = make_controller(
        str(tmp_path), lambda s: [], cfg, {"x": tune.uniform(0, 1)}, clock=clock, executor=ex
    )
    trials = ctl.run()
    # 2 at a time, 5 polls each (4 reports + return): about 4 trials in 10 ticks
    assert 3 <= len(trials) <= 6
    assert all(t.status is TrialStatus.TERMINATED for t in trials)
    assert clock.now <= 12


def test_points_to_evaluate_run_first(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(
        metric="loss", mode="min", num_samples=3, points_to_evaluate=[{"x": 0.25}, {"x": 0.75}]
    )
    ctl, _ = make_controller(str(tmp_path), curve, cfg, {"x": tune.uniform(0, 1)}, max_concurrent=1)
    trials = ctl.run()
    assert [t.config["x"] for t in trials[:2]] == [0.25, 0.75]
    assert len(trials) == 3


def test_grid_search_tries_every_combination_num_samples_times(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=2)
    space = {
        "a": tune.grid_search([1, 2]),
        "b": tune.grid_search(["x", "y"]),
        "x": tune.uniform(0, 1),
    }
    ctl, _ = make_controller(str(tmp_path), curve, cfg, space)
    trials = ctl.run()
    assert len(trials) == 8
    combos = sorted((t.config["a"], t.config["b"]) for t in trials)
    assert combos == sorted([(a, b) for a in (1, 2) for b in "xy"] * 2)


def test_trials_waiting_for_resources_are_announced_once(tmp_path: Any) -> None:
    progress = RecordingProgress()
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=2)
    ctl, _ = make_controller(
        str(tmp_path),
        lambda s: curve(s, 3),
        cfg,
        {"x": tune.uniform(0, 1)},
        capacity=1,
        progress=progress,
        resources_check_interval_s=0.0,
    )
    trials = ctl.run()
    assert progress.waiting == [["trial_00001"]]
    assert all(t.status is TrialStatus.TERMINATED for t in trials)


def test_a_trial_is_announced_only_when_it_still_waits_at_the_next_check() -> None:
    from lumos.tune._internal.live_trial import LiveTrial
    from lumos.tune._internal.waiting import WaitingWatch

    class Waiting:
        ids: list[str] = []

        def waiting_for_resources(self) -> list[str]:
            return list(self.ids)

    executor, progress = Waiting(), RecordingProgress()
    watch = WaitingWatch(executor, progress, {"CPU": 1.0})  # type: ignore[arg-type]
    running = {f"0000{i}": LiveTrial(i, {}, {}, f"/e/trial_0000{i}") for i in range(3)}
    executor.ids = ["00000", "00001"]  # Ray is placing them, or they wait: not known yet
    watch.check(running)
    assert progress.waiting == []
    assert [t.waiting_for_resources for t in running.values()] == [True, True, False]
    executor.ids = ["00001", "00002"]  # trial 0 was placed in time: never announced
    watch.check(running)
    assert progress.waiting == [["trial_00001"]]
    executor.ids = ["00001", "00002"]
    watch.check(running)
    watch.check(running)
    assert progress.waiting == [["trial_00001"], ["trial_00002"]]  # each one once


def test_the_waiting_message_names_only_the_resources_a_user_asks_for() -> None:
    import io

    from lumos.tune._internal.live_trial import LiveTrial
    from lumos.tune._internal.messages import waiting_for_resources
    from lumos.tune._internal.progress import ConsoleReporter

    resources = {
        "CPU": 2.0,
        "GPU": 1.0,
        "memory": 1e9,
        "accelerator": 1.0,
        "CPU_group_" + "d9a8" * 9: 2.0,
        "bundle_group_0_" + "d9a8" * 9: 0.001,
        "GPU_group_0_" + "d9a8" * 9: 1.0,
        "node:10.0.0.1": 1.0,
    }
    line = waiting_for_resources(["trial_00001"], resources)
    assert "_group_" not in line
    assert "node:" not in line
    assert "needs CPU=2, GPU=1, memory=953.67MiB, accelerator=1 and" in line
    buf = io.StringIO()
    reporter = ConsoleReporter(["loss"], file=buf, force_terminal=False)
    reporter.waiting_for_resources([LiveTrial(1, {}, {}, "/e/trial_00001")], resources)
    assert "trial_00001: waiting for resources" in buf.getvalue()
    assert "_group_" not in buf.getvalue()


def test_multi_objective_tells_every_value(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(
        metric=["loss", "cost"],
        mode=["min", "min"],
        num_samples=4,
        sampler=optuna.samplers.NSGAIISampler(seed=0),
    )

    def script(spec: TrialSpec) -> list[Step]:
        x = spec.config["x"]
        return [report({"loss": x, "cost": 1 - x})]

    ctl, _ = make_controller(str(tmp_path), script, cfg, {"x": tune.uniform(0, 1)})
    trials = ctl.run()
    for t, frozen in zip(trials, ctl.study.trials):
        assert frozen.values == pytest.approx([t.config["x"], 1 - t.config["x"]])


def test_without_a_metric_every_trial_just_runs(tmp_path: Any) -> None:
    cfg = tune.TuneConfig(num_samples=1)
    ctl, _ = make_controller(
        str(tmp_path), lambda s: [report({"acc": 1.0})], cfg, {"b": tune.grid_search([1, 2, 3])}
    )
    trials = ctl.run()
    assert sorted(t.config["b"] for t in trials) == [1, 2, 3]
    assert all(t.status is TrialStatus.TERMINATED for t in trials)


def test_trial_that_ignores_its_stop_is_ended_after_the_grace_period(tmp_path: Any) -> None:
    clock = FakeClock()

    class TickingExecutor(ScriptedExecutor):
        def poll(self, timeout_s: float | None) -> list[Any]:
            clock.now += 1.0
            return super().poll(timeout_s)

    ex = TickingExecutor(lambda s: [report({"loss": 1.0}), hang()])
    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=1, stop={"training_iteration": 1})
    ctl, _ = make_controller(
        str(tmp_path), lambda s: [], cfg, clock=clock, executor=ex, stop_grace_s=5.0
    )
    (trial,) = ctl.run()
    assert ex.stopped == ["00000"]
    assert ex.killed == ["00000"]
    assert trial.status is TrialStatus.TERMINATED
    assert 5.0 <= clock.now <= 8.0
    assert ctl.study.trials[0].value == 1.0


def test_finished_trials_keep_a_summary_and_read_their_reports_back_from_the_journal(
    tmp_path: Any,
) -> None:
    # Four shapes of history: plain; a retry from a checkpoint (reports up to it are
    # kept); a retry from scratch (starts over); a retry that fails before reporting.
    def script(spec: TrialSpec) -> list[Step]:
        n, first = spec.config["n"], spec.attempt == 0
        if n == 0:
            return [report({"loss": 3.0}), report({"loss": 2.0})]
        if n == 1 and first:
            return [
                report({"loss": 3.0}),
                report({"loss": 2.0}, checkpoint=True),
                report({"loss": 1.5}),
                fail("flaky"),
            ]
        if n == 1:
            return [report({"loss": 1.0}), report({"loss": 0.5})]
        if n == 2 and first:
            return [report({"loss": 9.0}), report({"loss": 8.0}), fail("flaky")]
        if n == 2:
            return [report({"loss": 7.0})] * 3
        return [report({"loss": 6.0}), report({"loss": 5.0}), fail("flaky")] if first else [fail()]

    told: dict[str, list[dict[str, Any]]] = {}

    class Recorder(tune.Callback):
        def on_trial_complete(self, trial: tune.Trial) -> None:
            told[trial.trial_name] = list(trial.history)

        def on_trial_error(self, trial: tune.Trial) -> None:
            told[trial.trial_name] = list(trial.history)

    cfg = tune.TuneConfig(metric="loss", mode="min")
    space = {"n": tune.grid_search([0, 1, 2, 3])}
    ctl, _ex = make_controller(str(tmp_path), script, cfg, space, max_failures=1)
    ctl.callbacks = [Recorder()]
    trials = ctl.run()
    assert [[r["loss"] for r in told[t.trial_name]] for t in trials] == [
        [3.0, 2.0],
        [3.0, 2.0, 1.0, 0.5],
        [7.0, 7.0, 7.0],
        [],
    ]
    for t in trials:
        assert t.status.is_finished
        assert not t.rows  # the driver keeps no history of its own...
        assert t.history == told[t.trial_name]  # ...and reads it back as it was
        assert list(t.snapshot().history) == told[t.trial_name]
        result = Result._of_finished_sweep(t, ctl.exp.storage.fs)
        assert result.metrics_dataframe.to_dict("records") == told[t.trial_name]
        assert result.metrics == t.last_result
    # A new driver (restore) reads the same histories.
    ctl.exp.close()
    exp = open_experiment(ctl.exp.storage, SearchSpace(space), cfg)
    assert [t.history for t in exp.trials] == [told[t.trial_name] for t in trials]


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_a_trial_end_is_in_the_journal_before_anyone_is_told(tmp_path: Any, backend: str) -> None:
    storage_path = str(tmp_path) if backend == "local" else f"memory://ends-{uuid.uuid4().hex}"
    seen: list[tuple[str, str, bool]] = []

    def written_ends() -> set[int]:
        journal = ctl.exp.trials_journal.journal
        reader = TrialJournal(FsJournal(journal.fs, journal.path, writable=False))
        return {r.number for r in reader.read() if isinstance(r, EndRecord)}

    class Watcher(tune.Callback):
        def on_trial_result(self, trial: tune.Trial, result: dict[str, Any]) -> None:
            seen.append(("result", trial.trial_name, trial.number in written_ends()))

        def on_trial_complete(self, trial: tune.Trial) -> None:
            seen.append(("complete", trial.trial_name, trial.number in written_ends()))

    class Progress(RecordingProgress):
        def trial_done(self, trial: Any) -> None:
            seen.append(("done", trial.trial_name, trial.number in written_ends()))

    def script(spec: TrialSpec) -> list[Step]:
        return [report({"loss": 1.0})] * (1 + int(spec.trial_id))

    cfg = tune.TuneConfig(metric="loss", mode="min", num_samples=3)
    ctl, _ex = make_controller(storage_path, script, cfg, max_concurrent=3, progress=Progress())
    ctl.callbacks = [Watcher()]
    ctl.run()
    # Every end was written before the progress display or a callback heard of it...
    assert [(kind, name) for kind, name, _ in seen if kind != "result"] == [
        (kind, f"trial_{n:05d}") for n in range(3) for kind in ("done", "complete")
    ]
    assert all(written for kind, _, written in seen if kind != "result")
    # ...and what was told after an end waited for it in order: trial 0's end came in the
    # same batch as trial 1's and 2's second reports, and is told before them.
    assert [(kind, name[-1]) for kind, name, _ in seen] == [
        ("result", "0"),
        ("result", "1"),
        ("result", "2"),
        ("done", "0"),
        ("complete", "0"),
        ("result", "1"),
        ("result", "2"),
        ("done", "1"),
        ("complete", "1"),
        ("result", "2"),
        ("done", "2"),
        ("complete", "2"),
    ]
