"""``lumos.runtime.claim_run``: unique default names and ``RunConfig(if_exists)``, on real
storage with real leases (the decision Train and Tune share)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lumos.runtime import ClaimRules, RunClaim, RunConfig, claim_run, finished_text, unique_run_name
from lumos.storage import LeaseHeldError, RunState, RunStorage


class Refused(ValueError):
    pass


def rules(lines: list[str], differs: dict[str, str] | None = None) -> ClaimRules:
    """Runs exist once they have a state; ``differs`` names the runs that are another job."""
    return ClaimRules(
        kind="run",
        exists=lambda s: s.load_state() is not None,
        matches=lambda s: (differs or {}).get(s.name),
        error=Refused,
        say=lines.append,
    )


def stored(tmp_path: Path, name: str) -> RunStorage:
    storage = RunStorage(str(tmp_path), name)
    storage.save_state(RunState(name=name))
    return storage


def claim(tmp_path: Path, name: str, if_exists: str, lines: list[str], **kw: object) -> RunClaim:
    differs = kw.pop("differs", None)
    got = claim_run(
        lambda n: RunStorage(str(tmp_path), n),
        name,
        if_exists,  # type: ignore[arg-type]
        rules(lines, differs),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    got.lease.release()
    return got


def test_unique_names_are_readable_and_differ_within_one_second() -> None:
    names = {unique_run_name("train") for _ in range(200)}
    assert len(names) == 200
    for name in names:
        assert re.fullmatch(r"train-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d-[0-9a-f]{6}", name), name


def test_a_generated_name_that_is_taken_or_leased_draws_another(tmp_path: Path) -> None:
    stored(tmp_path, "gen-1")
    held = RunStorage(str(tmp_path), "gen-2").acquire_lease()  # a live driver starting it
    draws = iter(["gen-2", "gen-3"])
    lines: list[str] = []
    got = claim(tmp_path, "gen-1", "resume", lines, generated=lambda: next(draws))
    held.release()
    assert got.storage.name == "gen-3"
    assert got.fresh
    assert lines == []  # a generated name is nobody's: nothing to say


def test_resume_is_the_default_and_resumes_the_same_run(tmp_path: Path) -> None:
    assert RunConfig().if_exists == "resume"
    stored(tmp_path, "run")
    lines: list[str] = []
    got = claim(tmp_path, "run", "resume", lines)
    assert (got.storage.name, got.fresh, lines) == ("run", False, [])
    fresh = claim(tmp_path, "other", "resume", lines)
    assert (fresh.storage.name, fresh.fresh) == ("other", True)


def test_error_names_the_field_the_value_the_path_and_the_choices(tmp_path: Path) -> None:
    storage = stored(tmp_path, "run")
    with pytest.raises(Refused) as info:
        claim(tmp_path, "run", "error", [])
    text = str(info.value)
    for part in ("if_exists='error'", "'run'", storage.uri, "'resume'", "'new'"):
        assert part in text
    # the refused run's lease was given back: a resume takes it at once
    assert claim(tmp_path, "run", "resume", []).storage.name == "run"
    assert claim(tmp_path, "free", "error", []).fresh  # nothing stored: no refusal


def test_new_starts_beside_and_says_so(tmp_path: Path) -> None:
    stored(tmp_path, "run")
    stored(tmp_path, "run-2")
    lines: list[str] = []
    got = claim(tmp_path, "run", "new", lines)
    assert (got.storage.name, got.fresh) == ("run-3", True)
    assert lines == [
        f"run 'run' already exists at {RunStorage(str(tmp_path), 'run').uri}: starting a "
        "new run 'run-3' beside it (RunConfig(if_exists='new'))"
    ]


def test_resume_of_another_job_goes_beside_or_resumes_the_matching_one(tmp_path: Path) -> None:
    stored(tmp_path, "exp")
    lines: list[str] = []
    first = claim(tmp_path, "exp", "resume", lines, differs={"exp": "metric 'a' there, 'b' here"})
    assert (first.storage.name, first.fresh) == ("exp-2", True)
    assert "is another sweep (metric 'a' there, 'b' here); it is kept as it is" in lines[-1]
    assert lines[-1].endswith("starting this one as 'exp-2' beside it")
    stored(tmp_path, "exp-2")
    again = claim(tmp_path, "exp", "resume", lines, differs={"exp": "metric differs"})
    assert (again.storage.name, again.fresh) == ("exp-2", False)  # rerun: resumes its own
    assert lines[-1].endswith("resuming the matching run 'exp-2' beside it")


@pytest.mark.parametrize("exists", [False, True])
def test_a_claim_removes_what_a_killed_driver_left_half_written(
    tmp_path: Path, exists: bool
) -> None:
    """A driver SIGKILLed in an atomic write (its lease's renewal, a Tune sweep's state)
    leaves the temporary file; whoever claims the run next (a fresh start or a resume,
    Train or Tune) removes it, and nothing else."""
    if exists:
        stored(tmp_path, "run")
    lumos_dir = tmp_path / "run" / "_lumos"
    lumos_dir.mkdir(parents=True, exist_ok=True)
    left = [
        lumos_dir / ".lease.json.tmp-192b405583234787839d38a81f535374",
        lumos_dir / ".tuner.json.tmp-0123456789abcdef0123456789abcdef",
    ]
    for path in left:
        path.write_bytes(b'{"holder": "ho')
    (lumos_dir / "notes.json").write_text("{}")
    got = claim(tmp_path, "run", "resume", [])
    assert (got.storage.name, got.fresh) == ("run", not exists)
    assert not any(p.exists() for p in left)
    assert (lumos_dir / "notes.json").exists()
    assert [p.name for p in lumos_dir.iterdir() if ".tmp-" in p.name] == []


def test_a_live_driver_on_the_named_run_is_still_refused(tmp_path: Path) -> None:
    stored(tmp_path, "run")
    held = RunStorage(str(tmp_path), "run").acquire_lease()
    try:
        with pytest.raises(LeaseHeldError):
            claim(tmp_path, "run", "resume", [])
        with pytest.raises(LeaseHeldError):
            claim(tmp_path, "run", "error", [])
        # "new" goes beside it, and skips a candidate a live driver holds
        held_2 = RunStorage(str(tmp_path), "run-2").acquire_lease()
        try:
            assert claim(tmp_path, "run", "new", []).storage.name == "run-3"
        finally:
            held_2.release()
    finally:
        held.release()


@pytest.mark.parametrize("value", ["Resume", "overwrite", None, 1, True])
def test_a_bad_if_exists_names_the_field_the_value_and_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as info:
        RunConfig(if_exists=value)
    text = str(info.value)
    assert f"if_exists={value!r} is not allowed" in text
    for choice in ("'resume'", "'error'", "'new'"):
        assert choice in text


def test_finished_text_says_when_and_how_to_run_again() -> None:
    text = finished_text("run", "x", 0.0, "/runs/x")
    assert text.startswith("run 'x' in /runs/x already finished at ")
    assert text.endswith("; returning its stored result (RunConfig(if_exists='new') runs it again)")
