"""``lumos migrate``: Ray Train / Tune sources rewritten to lumos (libcst, no Ray needed).

Lumos-tune's tests run the command on Ray's own example scripts and check that every
target of the table exists; here each kind of rewrite, the warnings and the command.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumos.storage._internal.migrate_resolve import Mapped, Missing, is_ours, lookup, resolve
from lumos.storage._internal.migrate_table import AMBIGUOUS, MISSING, MODULES, NAMES, RAY_ALIASES
from lumos.storage.cli import EXIT_ERROR, EXIT_USAGE, app
from lumos.storage.migrate import Migration, migrate_source


def migrate(source: str) -> Migration:
    return migrate_source(textwrap.dedent(source).lstrip("\n"))


def code(source: str) -> str:
    return migrate(source).code


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def messages(done: Migration) -> list[tuple[int, str]]:
    return [(w.line, w.message) for w in done.warnings]


# -- imports --------------------------------------------------------------------------------


def test_from_ray_import_train_and_tune() -> None:
    done = migrate("from ray import train, tune\n")
    assert done.code == "from lumos import train, tune\n"
    assert (done.rewrites, done.warnings, done.changed) == (2, (), True)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("import ray.tune as tune\n", "import lumos.tune as tune\n"),
        ("import ray.train.torch as rt\n", "import lumos.train.torch as rt\n"),
        (
            "from ray.train import ScalingConfig, RunConfig\n",
            "from lumos.train import ScalingConfig, RunConfig\n",
        ),
        ("from ray.tune import Tuner, TuneConfig\n", "from lumos.tune import Tuner, TuneConfig\n"),
        (
            "from ray.train.torch import TorchTrainer, prepare_model\n",
            "from lumos.train.torch import TorchTrainer, prepare_model\n",
        ),
        (
            "from ray.tune.search.optuna import OptunaSearch\n",
            "from lumos.tune.search.optuna import OptunaSearch\n",
        ),
        (
            "from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining\n",
            "from lumos.tune.schedulers import ASHAScheduler, PopulationBasedTraining\n",
        ),
        (
            "from ray.tune.stopper import TrialPlateauStopper\n",
            "from lumos.tune.stopper import TrialPlateauStopper\n",
        ),
        ("from ray.air import ScalingConfig\n", "from lumos.train import ScalingConfig\n"),
        ("from ray.air.config import ScalingConfig\n", "from lumos.train import ScalingConfig\n"),
        (
            "from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer\n",
            "from lumos.train import DataParallelTrainer\n",
        ),
        (
            "from ray.train.v2.api.config import ScalingConfig as SC\n",
            "from lumos.train import ScalingConfig as SC\n",
        ),
        (
            "from ray.tune.schedulers.async_hyperband import ASHAScheduler\n",
            "from lumos.tune.schedulers import ASHAScheduler\n",
        ),
        ("from ray.train import torch\n", "from lumos.train import torch\n"),
        ("from ray.tune import search as s\n", "from lumos.tune import search as s\n"),
        (
            "from ray.tune.result import TRAINING_ITERATION\n",
            "from lumos.tune.result import TRAINING_ITERATION\n",
        ),
    ],
)
def test_each_import_kind(before: str, after: str) -> None:
    done = migrate(before)
    assert done.code == after
    assert done.warnings == ()


def test_a_deep_module_imported_as_a_name_keeps_its_local_name() -> None:
    # `config` is now lumos.train itself: `config.ScalingConfig` still means the same
    source = """
        from ray.train.v2.api import config
        config.ScalingConfig(num_workers=2)
    """
    assert code(source) == dedent("""
        from lumos import train as config
        config.ScalingConfig(num_workers=2)
    """)


def test_ray_air_names_follow_the_file_train_or_tune() -> None:
    train_only = migrate("from ray.air import RunConfig, ScalingConfig\n")
    assert train_only.code == "from lumos.train import RunConfig, ScalingConfig\n"
    tune_file = migrate("""
        from ray import tune
        from ray.air import RunConfig, ScalingConfig
    """)
    assert tune_file.code == dedent("""
        from lumos import tune
        from lumos.tune import RunConfig
        from lumos.train import ScalingConfig
    """)
    # the choice is a warning: the user checks it
    ((line, message),) = messages(tune_file)
    assert line == 2
    assert "chose lumos.tune.RunConfig" in message
    assert "lumos.train.RunConfig" in message


def test_a_renamed_name_is_renamed_in_its_uses_too() -> None:
    source = """
        from ray.tune.logger import JsonLoggerCallback, CSVLoggerCallback
        from ray.train.lightning import RayTrainReportCallback as Cb, RayDDPStrategy

        callbacks = [JsonLoggerCallback(), CSVLoggerCallback(), Cb()]
        strategy = RayDDPStrategy()
        kind = JsonLoggerCallback.__name__
    """
    assert code(source) == dedent("""
        from lumos.tune.logger import JSONLoggerCallback, CSVLoggerCallback
        from lumos.train.lightning import ReportCallback as Cb, LumosDDPStrategy

        callbacks = [JSONLoggerCallback(), CSVLoggerCallback(), Cb()]
        strategy = LumosDDPStrategy()
        kind = JSONLoggerCallback.__name__
    """)


def test_x_as_x_of_a_renamed_name_drops_the_alias() -> None:
    source = """
        from ray.tune import TuneContext as TuneContext
        def f(ctx: TuneContext) -> None: ...
    """
    assert code(source) == dedent("""
        from lumos.tune import TrialContext
        def f(ctx: TrialContext) -> None: ...
    """)


def test_names_lumos_lacks_stay_rays_with_a_warning_and_the_rest_moves() -> None:
    source = """
        import os
        from ray.tune import (
            Tuner,  # the tuner
            CLIReporter,  # the reporter
            TuneConfig,
        )
        from ray.train.torch import TorchTrainer, prepare_optimizer
    """
    done = migrate(source)
    assert done.code == dedent("""
        import os
        from lumos.tune import (
            Tuner,  # the tuner
            TuneConfig,
        )
        from ray.tune import (
            CLIReporter,  # the reporter
        )
        from lumos.train.torch import TorchTrainer
        from ray.train.torch import prepare_optimizer
    """)
    assert done.rewrites == 3
    (line1, reporter), (line2, optimizer) = messages(done)
    assert line1 == 2
    assert reporter.startswith("ray.tune.CLIReporter: lumos prints its own progress")
    assert line2 == 7
    assert optimizer.startswith("ray.train.torch.prepare_optimizer: not needed")


def test_names_of_one_import_that_go_to_two_lumos_modules() -> None:
    done = migrate("""
        from ray import tune
        from ray.air.integrations.mlflow import MLflowLoggerCallback, setup_mlflow  # both
    """)
    assert done.code == dedent("""
        from lumos import tune
        from lumos.tune.integrations.mlflow import MLflowLoggerCallback  # both
        from lumos.train.integrations.mlflow import setup_mlflow
    """)


def test_an_import_among_other_statements_on_one_line_stays_on_it() -> None:
    assert code("import os; from ray.tune import Tuner, CLIReporter\n") == (
        "import os; from lumos.tune import Tuner; from ray.tune import CLIReporter\n"
    )


def test_unknown_modules_and_names_are_warnings_naming_the_line() -> None:
    done = migrate("""
        import ray
        from ray.tune.search.hyperopt import HyperOptSearch
        from ray.train.xgboost import XGBoostTrainer
        from ray.tune import NoSuchThing
        import ray.air as air
    """)
    assert done.code == dedent("""
        import ray
        from ray.tune.search.hyperopt import HyperOptSearch
        from ray.train.xgboost import XGBoostTrainer
        from ray.tune import NoSuchThing
        import ray.air as air
    """)
    assert not done.changed
    lines = messages(done)
    assert [n for n, _ in lines] == [2, 3, 4, 5]
    assert "lumos searches with Optuna" in lines[0][1]
    assert "lumos trains PyTorch" in lines[1][1]
    assert lines[2][1] == "ray.tune.NoSuchThing: lumos.tune has no 'NoSuchThing'; port it by hand"
    assert lines[3][1].startswith("ray.air: ray.air has no single lumos module")


def test_star_import_is_rewritten_with_a_warning() -> None:
    done = migrate("from ray.tune.schedulers import *\n")
    assert done.code == "from lumos.tune.schedulers import *\n"
    assert "check that lumos has every name" in done.warnings[0].message


# -- uses -----------------------------------------------------------------------------------


def test_ray_dot_tune_uses_after_import_ray_get_a_lumos_import() -> None:
    source = """
        import os
        import ray  # the cluster

        ray.init(num_cpus=2)


        @ray.remote
        def work(config):
            ray.tune.report({"loss": 1.0})  # report
            return ray.train.torch.TorchTrainer, ray.tune.schedulers.ASHAScheduler(max_t=3)
    """
    done = migrate(source)
    assert done.code == dedent("""
        import os
        import ray  # the cluster
        import lumos.train.torch
        import lumos.tune
        import lumos.tune.schedulers

        ray.init(num_cpus=2)


        @ray.remote
        def work(config):
            lumos.tune.report({"loss": 1.0})  # report
            return lumos.train.torch.TorchTrainer, lumos.tune.schedulers.ASHAScheduler(max_t=3)
    """)
    assert (done.rewrites, done.warnings) == (3, ())


def test_import_ray_dot_tune_still_binds_ray_where_the_code_needs_it() -> None:
    source = """
        import ray.tune
        ray.init()
        ray.tune.report({"x": 1})
    """
    assert code(source) == dedent("""
        import ray
        import lumos.tune
        ray.init()
        lumos.tune.report({"x": 1})
    """)
    # no other use of `ray`: no `import ray` added
    assert code("import ray.tune\nray.tune.report({})\n") == (
        "import lumos.tune\nlumos.tune.report({})\n"
    )


def test_uses_through_a_rewritten_module_import() -> None:
    source = """
        from ray import tune
        from ray.tune import search

        cb = tune.logger.JsonLoggerCallback()
        tune.run(objective)
        search.grid_search([1, 2])
        tune.report({"x": 1})
    """
    done = migrate(source)
    assert done.code == dedent("""
        from lumos import tune
        from lumos.tune import search

        cb = tune.logger.JSONLoggerCallback()
        tune.run(objective)
        search.grid_search([1, 2])
        tune.report({"x": 1})
    """)
    ((line, run),) = messages(done)
    assert line == 5
    assert run.startswith("tune.run: use tune.Tuner(")


def test_a_use_through_a_module_where_lumos_keeps_the_name_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no such entry today (lumos keeps Ray's module paths): a table that had one
    monkeypatch.setitem(NAMES, "ray.tune.search.grid_search", "lumos.tune.grid_search")
    done = migrate("""
        from ray.tune import search
        search.grid_search([1, 2])
    """)
    assert done.code == "from lumos.tune import search\nsearch.grid_search([1, 2])\n"
    assert messages(done) == [
        (2, "search.grid_search: lumos has it as lumos.tune.grid_search; import it from there")
    ]


def test_a_local_name_that_shadows_an_import_is_left_alone() -> None:
    source = """
        from ray.tune.logger import JsonLoggerCallback

        def f(JsonLoggerCallback, tune):
            return JsonLoggerCallback(), tune.run()
    """
    assert code(source) == dedent("""
        from lumos.tune.logger import JSONLoggerCallback

        def f(JsonLoggerCallback, tune):
            return JsonLoggerCallback(), tune.run()
    """)


def test_the_rest_of_ray_is_left_alone() -> None:
    source = """
        import ray
        import ray.data
        from ray import serve
        from ray.util.placement_group import placement_group

        ray.init(address="auto")
        ds = ray.data.range(10)
        ref = ray.remote(lambda: 1).remote()
        name = "ray.tune.report"  # a string and a comment: ray.tune.report
    """
    done = migrate(source)
    assert done.code == dedent(source)
    assert (done.changed, done.rewrites, done.warnings) == (False, 0, ())


def test_comments_blank_lines_and_odd_formatting_stay() -> None:
    source = '''
        #!/usr/bin/env python
        """A script: ray.tune stays in this docstring."""
        # a comment before
        from ray   import  tune   # spaced out


        def objective(config):   # keeps its comment
            tune.report( {"loss":   (config["x"] - 2) ** 2} )  # odd spacing
            # a comment inside


        if __name__ == "__main__":
            tune.Tuner(objective,
                       param_space={"x": tune.uniform(-10, 10)},   # aligned
            ).fit()
    '''
    before = dedent(source)
    done = migrate(source)
    assert done.code == before.replace("from ray   import  tune", "from lumos   import  tune")


def test_a_migrated_source_migrates_to_itself() -> None:
    source = """
        import ray
        from ray import tune
        from ray.tune.logger import JsonLoggerCallback
        from ray.tune import Tuner, CLIReporter
        ray.tune.report({})
    """
    once = migrate(source)
    twice = migrate_source(once.code)
    assert twice.code == once.code
    assert twice.rewrites == 0


def test_a_source_that_does_not_parse_raises() -> None:
    import libcst

    with pytest.raises(libcst.ParserSyntaxError):
        migrate_source("from ray import (tune\n")


# -- the table ------------------------------------------------------------------------------


def test_the_table_is_consistent() -> None:
    for name in [*MODULES, *NAMES, *AMBIGUOUS, *MISSING, *RAY_ALIASES]:
        assert is_ours(name), name
    for target in [*MODULES.values(), *NAMES.values(), *(t for p in AMBIGUOUS.values() for t in p)]:
        assert target.startswith("lumos."), target
    known = [set(MODULES), set(NAMES), set(AMBIGUOUS), set(MISSING), set(RAY_ALIASES)]
    for i, first in enumerate(known):
        for second in known[i + 1 :]:
            assert not first & second, first & second
    for alias in RAY_ALIASES.values():
        assert alias in MODULES or alias in MISSING, alias


def test_lookup_and_resolve() -> None:
    assert lookup("ray.train.v2.api.config.ScalingConfig", False) == Mapped(
        "lumos.train.ScalingConfig"
    )
    assert lookup("ray.tune.search", False) == Mapped("lumos.tune.search", is_module=True)
    assert lookup("ray.tune.nothing", False) is None
    assert resolve("ray.tune.Tuner.restore", False) == (Mapped("lumos.tune.Tuner"), ".restore")
    assert resolve("ray.init", False) is None
    assert resolve("ray.trainer", False) is None  # not ray.train
    missing, rest = resolve("ray.tune.schedulers.pb2.PB2", False) or (None, "")
    assert isinstance(missing, Missing)
    assert "Optuna pruners" in missing.reason
    assert rest == ".PB2"  # what follows the known prefix
    assert Mapped("lumos.tune.Tuner").module == "lumos.tune"


# -- the command ----------------------------------------------------------------------------

SCRIPT = "import ray\nfrom ray import tune  # keep me\n\nray.init()\ntune.run(f)\n"


def write_tree(root: Path) -> dict[str, Path]:
    files = {
        "top": root / "train_it.py",
        "nested": root / "pkg" / "sub" / "tune_it.py",
        "plain": root / "pkg" / "plain.py",
        "hidden": root / ".venv" / "lib" / "ray_user.py",
        "cache": root / "pkg" / "__pycache__" / "tune_it.py",
        "text": root / "notes.txt",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SCRIPT)
    files["plain"].write_text("import os\n")
    return files


def test_command_rewrites_a_folder_recursively_in_place(tmp_path: Path) -> None:
    files = write_tree(tmp_path)
    run = CliRunner().invoke(app, ["migrate", str(tmp_path)])
    assert run.exit_code == 0, run.output
    migrated = SCRIPT.replace("from ray import tune", "from lumos import tune")
    assert files["top"].read_text() == migrated
    assert files["nested"].read_text() == migrated
    for untouched in ("hidden", "cache", "text"):
        assert files[untouched].read_text() == SCRIPT
    assert f"rewrote {files['top']}: 1 rewrite\n" in run.stdout
    assert f"rewrote {files['nested']}: 1 rewrite\n" in run.stdout
    assert "plain.py" not in run.stdout
    assert "changed 2 files of 3 (2 rewrites, 2 warnings)" in run.stdout
    assert f"{files['top']}:5: warning: tune.run: use tune.Tuner(" in run.stderr


def test_command_dry_run_prints_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    run = CliRunner().invoke(app, ["migrate", "--dry-run", str(script)])
    assert run.exit_code == 0, run.output
    assert script.read_text() == SCRIPT
    assert f"--- a/{script}\n+++ b/{script}\n" in run.stdout
    assert "-from ray import tune  # keep me\n+from lumos import tune  # keep me\n" in run.stdout
    assert "rewrote" not in run.stdout
    assert "would change 1 file of 1 (1 rewrite, 1 warning)" in run.stderr


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch command")
def test_dry_run_diff_applies_with_patch(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.rstrip("\n"))  # no newline at the end
    command = "from lumos.storage.cli import main; main()"
    run = subprocess.run(
        [sys.executable, "-c", command, "migrate", "--dry-run", "s.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "\\ No newline at end of file" in run.stdout
    subprocess.run(
        ["patch", "-p1"], input=run.stdout, cwd=tmp_path, text=True, check=True, capture_output=True
    )
    assert script.read_text() == migrate_source(SCRIPT.rstrip("\n")).code


def test_command_missing_path_is_a_usage_error_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    run = CliRunner().invoke(app, ["migrate", str(script), str(tmp_path / "nope")])
    assert run.exit_code == EXIT_USAGE
    assert f"error: {tmp_path / 'nope'}: no such file or folder" in run.stderr
    assert script.read_text() == SCRIPT


def test_command_skips_a_file_that_does_not_parse_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "a_broken.py").write_text("from ray import tune\ndef f(:\n")
    good = tmp_path / "b_good.py"
    good.write_text("from ray import tune\n")
    run = CliRunner().invoke(app, ["migrate", str(tmp_path)])
    assert run.exit_code == EXIT_ERROR
    assert f"error: {tmp_path / 'a_broken.py'}: line 2: not valid Python" in run.stderr
    assert "skipped" in run.stderr
    assert good.read_text() == "from lumos import tune\n"
    assert (tmp_path / "a_broken.py").read_text() == "from ray import tune\ndef f(:\n"
    assert "changed 1 file of 2 (1 rewrite, 0 warnings); 1 file skipped" in run.stdout


def test_command_keeps_encoding_and_line_endings(tmp_path: Path) -> None:
    script = tmp_path / "latin.py"
    script.write_bytes(b"# -*- coding: latin-1 -*-\r\nfrom ray import tune\r\nx = '\xe9'\r\n")
    run = CliRunner().invoke(app, ["migrate", str(script)])
    assert run.exit_code == 0, run.output
    assert (
        script.read_bytes()
        == b"# -*- coding: latin-1 -*-\r\nfrom lumos import tune\r\nx = '\xe9'\r\n"
    )


def test_the_lumos_command_does_not_load_libcst_until_migrate() -> None:
    check = "import sys, lumos.storage.cli; assert 'libcst' not in sys.modules, 'libcst loaded'"
    subprocess.run([sys.executable, "-c", check], check=True)
