"""``lumos migrate`` (lumos-storage's command) on Ray Tune's own example scripts, and
every lumos.tune name its table rewrites to, imported from the installed package
(lumos-train's tests check the lumos.train names: this session has no lumos-train)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from test_tune_ray_examples import EXAMPLES, SCRIPTS, rewrite

from lumos.storage.migrate import lumos_targets, missing_targets

LUMOS = Path(sys.executable).parent / "lumos"  # the console script lumos-storage installs
RAY_EXAMPLES = [EXAMPLES, EXAMPLES.parent.parent / "train" / "examples"]

# Targets added for issue 30 with `lumos migrate` (Ray's names lumos gained): if one is
# missing here, that change is not installed yet, not a wrong table entry.
ADDED_FOR_MIGRATE = {
    "lumos.tune.Stopper",
    "lumos.tune.create_scheduler",
    "lumos.tune.create_searcher",
    "lumos.tune.integration",
    "lumos.tune.integration.ray_train",
    "lumos.tune.integration.ray_train.TuneReportCallback",
    "lumos.tune.result",
    "lumos.tune.stopper.ExperimentPlateauStopper",
    "lumos.tune.utils",
    "lumos.tune.utils.mock_trainable",
    "lumos.tune.utils.mock_trainable.MyTrainableClass",
} | {
    f"lumos.tune.result.{k}"
    for k in "DONE EPISODE_REWARD_MEAN MEAN_ACCURACY MEAN_LOSS SHOULD_CHECKPOINT "
    "TRAINING_ITERATION".split()
}


def lumos_migrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LUMOS), "migrate", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_every_lumos_tune_target_of_the_table_exists() -> None:
    targets = [t for t in lumos_targets() if t.target.split(".")[:2] == ["lumos", "tune"]]
    assert len(targets) > 60
    missing = missing_targets("tune")
    pending = [m for m in missing if m.split(" ")[0] in ADDED_FOR_MIGRATE]
    wrong = [m for m in missing if m not in pending]
    assert not wrong, "lumos migrate's table names lumos names that do not exist:\n" + "\n".join(
        wrong
    )
    assert not pending, "not installed yet (added for issue 30 with lumos migrate):\n" + "\n".join(
        pending
    )


def test_migrated_examples_import_lumos_and_compile(tmp_path: Path) -> None:
    for name in SCRIPTS:
        shutil.copy(EXAMPLES / f"{name}.py", tmp_path / f"{name}.py")
    run = lumos_migrate(".", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"changed {len(SCRIPTS)} files of {len(SCRIPTS)}" in run.stdout
    assert "warning" not in run.stderr, run.stderr
    for name in SCRIPTS:
        original = (EXAMPLES / f"{name}.py").read_text()
        migrated = (tmp_path / f"{name}.py").read_text()
        assert f"rewrote {name}.py: " in run.stdout
        assert "from lumos import tune" in migrated
        assert "from ray.tune" not in migrated
        assert "from ray import tune" not in migrated
        # the same as the hand rewrite test_tune_ray_examples.py runs (imports only)
        assert migrated == rewrite(original), name
        compile(migrated, name, "exec")


def test_every_ray_example_script_migrates_to_code_that_compiles(tmp_path: Path) -> None:
    """Train's and Tune's examples in the wheel: names lumos lacks are warnings, not errors."""
    for i, folder in enumerate(RAY_EXAMPLES):
        shutil.copytree(folder, tmp_path / str(i), ignore=shutil.ignore_patterns("__pycache__"))
    run = lumos_migrate(".", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "rewrote 0/tune_basic_example.py: " in run.stdout
    for script in tmp_path.rglob("*.py"):
        compile(script.read_text(), str(script), "exec")
    # a name lumos lacks is named with its file and line
    assert "pb2_example.py:" in run.stderr
    assert "warning: ray.tune.schedulers.pb2.PB2:" in run.stderr


# The migrated scripts run under lumos in test_tune_ray_examples.py (one shared HOME):
# `lumos migrate` writes the same code there as here (test_migrated_examples_import_lumos_and_compile).
