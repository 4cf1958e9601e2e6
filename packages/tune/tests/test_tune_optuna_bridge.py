"""The Optuna private API lumos.tune relies on is still there (fails loudly if not)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import optuna
import pytest

from lumos.tune._internal import optuna_bridge
from lumos.tune._internal.optuna_bridge import OptunaApiChangedError

SRC = Path(__file__).resolve().parents[1] / "src" / "lumos" / "tune"


@pytest.mark.parametrize(("owner", "attribute"), optuna_bridge.PRIVATE_ATTRIBUTES)
def test_every_private_attribute_exists_in_the_installed_optuna(
    owner: str, attribute: str, tmp_path: Path
) -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.ask()
    journal = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))
    )
    objects = {
        "optuna.Study": study,
        "optuna.trial.FrozenTrial": study.get_trials(deepcopy=False)[0],
        "optuna.storages.JournalStorage": journal,
        "optuna.storages.journal.JournalStorageReplayResult": getattr(journal, "_replay_result"),
        "optuna.study._tell": importlib.import_module("optuna.study._tell"),
    }
    if not hasattr(objects[owner], attribute):
        pytest.fail(str(OptunaApiChangedError(owner, attribute)))


def test_the_bridge_works_against_the_installed_optuna() -> None:
    optuna_bridge.check_private_api()


def test_the_bridge_round_trips_a_running_trial() -> None:
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.ask()
    asked = study.ask()
    frozen = optuna_bridge.stored_trial(study, asked.number)
    assert frozen.number == asked.number == 1
    assert optuna_bridge.trial_id_of(frozen) == optuna_bridge.trial_id_of_number(study, 1)
    attached = optuna_bridge.attach_number(study, 1)
    attached.report(0.5, 1)
    optuna_bridge.tell(study, attached, [0.25])
    assert optuna_bridge.stored_trial(study, 1).state.is_finished()
    assert optuna_bridge.stored_trial(study, 1).value == 0.25
    optuna_bridge.tell(study, 0, state=optuna.trial.TrialState.PRUNED)
    assert optuna_bridge.stored_trial(study, 0).state == optuna.trial.TrialState.PRUNED


def test_a_missing_attribute_names_itself_and_the_optuna_version() -> None:
    class NotAStudy:
        pass

    with pytest.raises(OptunaApiChangedError) as info:
        optuna_bridge.trial_id_of_number(NotAStudy(), 0)  # type: ignore[arg-type]
    message = str(info.value)
    assert "optuna.Study._storage" in message
    assert f"optuna {optuna.__version__}" in message


def test_no_other_module_touches_optuna_private_attributes() -> None:
    private = {attribute for _, attribute in optuna_bridge.PRIVATE_ATTRIBUTES}
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "optuna_bridge.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            on_self = isinstance(node, ast.Attribute) and (
                isinstance(node.value, ast.Name) and node.value.id == "self"
            )
            if isinstance(node, ast.Attribute) and node.attr in private and not on_self:
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert not offenders, "use lumos.tune._internal.optuna_bridge instead:\n" + "\n".join(offenders)
