"""A driver SIGKILLed at any phase, then a rerun: the same ``Result`` as a run never
interrupted (metrics, checkpoint, best checkpoints, metrics history), and a run whose
training had finished does not run the training function again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import phase_fns
import pytest
from drivers import kill_driver, start_driver, wait_for_state
from ray import cloudpickle

from lumos import train
from lumos.storage import RunState, RunStorage

cloudpickle.register_pickle_by_value(phase_fns)

_TRAINER = """
config = {config!r}
trainer = train.DataParallelTrainer(
    phase_fns.phase_run,
    train_loop_config=config,
    scaling_config=train.ScalingConfig(num_workers={workers}),
    run_config=train.RunConfig(name="run", storage_path={root!r}, verbose=False),
    validation_config=train.ValidationConfig(
        phase_fns.validate,
        train.ValidationTaskConfig(fn_kwargs={{"gate": config.get("gate"), "hold": config.get("hold")}}),
    ),
)
"""


def _trainer(root: Path, config: dict[str, Any], workers: int = 2) -> train.DataParallelTrainer:
    namespace: dict[str, Any] = {"train": train, "phase_fns": phase_fns}
    exec(_TRAINER.format(config=config, root=str(root), workers=workers), namespace)
    return namespace["trainer"]


def _summary(result: train.Result) -> dict[str, Any]:
    assert result.checkpoint is not None
    return {
        "metrics": result.metrics,
        "checkpoint": Path(result.checkpoint.path).name,
        "best": [(Path(c.path).name, m) for c, m in result.best_checkpoints],
        "history": result.metrics_dataframe.to_dict("records"),
    }


def _at(phase: str) -> Any:
    def reached(state: RunState) -> bool:
        if phase == "training":
            return state.latest_checkpoint == "ckpt-2"
        if phase == "after_last_report":
            return state.latest_checkpoint == "ckpt-4"
        return bool(state.extra.get("training_finished"))  # validation

    return reached


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster: str, tmp_path_factory: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("uninterrupted")
    config = {"starts": str(root / "starts")}
    return _summary(_trainer(root, config).fit())


@pytest.mark.parametrize("phase", ["training", "after_last_report", "validation", "finished"])
def test_a_rerun_after_a_driver_kill_returns_the_uninterrupted_result(
    ray_cluster: str, uninterrupted: dict[str, Any], tmp_path: Path, phase: str
) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    config = {"starts": str(tmp_path / "starts"), "gate": str(gate), "hold": phase}
    body = _TRAINER.format(config=config, root=str(tmp_path), workers=2) + "trainer.fit()\n"
    proc = start_driver(tmp_path, ray_cluster, "phase_fns", body)
    storage = RunStorage(str(tmp_path), "run")
    if phase == "finished":
        gate.unlink()
        assert proc.wait(timeout=240) == 0
    else:
        wait_for_state(proc, storage, _at(phase), phase)
        kill_driver(proc)
        gate.unlink()
    starts_before = (tmp_path / "starts").read_text().count("start")
    assert _summary(_trainer(tmp_path, config).fit()) == uninterrupted
    starts = (tmp_path / "starts").read_text().count("start")
    if phase in ("validation", "finished"):
        assert starts == starts_before == 1  # training had finished: not run again
    else:
        assert starts == starts_before + 1
    state = storage.load_state()
    assert state is not None
    assert state.status == "finished"


def test_a_rerun_in_local_mode_after_training_finished_only_validates(tmp_path: Path) -> None:
    # Local mode: the function runs in this process; a validation left pending (the
    # driver died while it ran) runs on the rerun, and the function does not run again.
    config = {"starts": str(tmp_path / "starts")}
    trainer = _trainer(tmp_path, config, workers=0)
    first = trainer.fit()
    storage = RunStorage(str(tmp_path), "run")
    state = storage.load_state()
    assert state is not None
    # As a driver killed during the last validation leaves it: pending, training done.
    records = [
        r.model_copy(update={"validation_status": "pending"}) if r.dir_name == "ckpt-4" else r
        for r in state.checkpoints
    ]
    extra = {**state.extra, "training_finished": True}
    storage.save_state(
        state.model_copy(update={"status": "running", "checkpoints": records, "extra": extra})
    )
    again = trainer.fit()
    assert (tmp_path / "starts").read_text().count("start") == 1
    assert _summary(again) == _summary(first)
