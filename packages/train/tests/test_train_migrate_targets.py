"""Every lumos.train name that ``lumos migrate`` (lumos-storage's command) rewrites Ray
Train code to exists in the installed lumos-train, extras included (lumos-tune's tests
check the lumos.tune names and run the command on Ray's example scripts)."""

from __future__ import annotations

from lumos.storage.migrate import lumos_targets, missing_targets

# Targets added for issue 30 with `lumos migrate` (Ray's names lumos gained): if one is
# missing here, that change is not installed yet, not a wrong table entry.
ADDED_FOR_MIGRATE = {
    "lumos.train.ControllerError",
    "lumos.train.UserCallback",
    "lumos.train.WorkerGroupError",
}


def test_every_lumos_train_target_of_the_table_exists() -> None:
    targets = [t for t in lumos_targets() if t.target.split(".")[:2] == ["lumos", "train"]]
    assert len(targets) > 30
    missing = missing_targets("train")
    pending = [m for m in missing if m.split(" ")[0] in ADDED_FOR_MIGRATE]
    wrong = [m for m in missing if m not in pending]
    assert not wrong, "lumos migrate's table names lumos names that do not exist:\n" + "\n".join(
        wrong
    )
    assert not pending, "not installed yet (added for issue 30 with lumos migrate):\n" + "\n".join(
        pending
    )
