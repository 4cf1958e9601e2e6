"""Clear messages for unknown config fields: the field, where it belongs if it belongs
elsewhere, what Ray Tune users should write instead, or the closest valid name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from lumos.tune._internal.errors import TuneConfigError

TUNE_ONLY = [
    "metric",
    "mode",
    "sampler",
    "pruner",
    "scheduler",
    "search_alg",
    "num_samples",
    "max_concurrent_trials",
    "reuse_actors",
    "time_budget_s",
    "trial_resources",
    "points_to_evaluate",
    "fail_fast",
    "trial_name_creator",
    "trial_dirname_creator",
]
RUN_ONLY = [
    "name",
    "storage_path",
    "storage_filesystem",
    "failure_config",
    "checkpoint_config",
    "callbacks",
    "verbose",
    "if_exists",
]

# Ray Tune fields lumos has no use for, and why.
RAY_NOTES = {
    "chdir_to_trial_dir": "trials run in their actor's directory; use "
    "tune.get_context().get_trial_dir() for the trial's storage",
    "sync_config": "trial files are written to RunConfig(storage_path=...) directly; drop it",
    "progress_reporter": "the console is built in; set RunConfig(verbose=0/1/2)",
    "log_to_file": "trial output goes to Ray's worker logs; drop it",
    "local_dir": "use RunConfig(storage_path=...)",
}


def check_fields(
    owner: str, data: Mapping[str, Any], fields: Iterable[str], other: tuple[str, list[str]]
) -> None:
    """Raise :class:`TuneConfigError` for the first key of ``data`` not in ``fields``.

    Args:
        owner: The config's name (``"TuneConfig"``).
        data: The keyword arguments given.
        fields: The config's field names.
        other: ``(name, fields)`` of the sibling config, to say where a field belongs.
    """
    valid = set(fields)
    for key in data:
        if key in valid:
            continue
        if key in other[1]:
            raise TuneConfigError(
                f"{owner}({key}=...): {key!r} is not a {owner} field; it belongs in "
                f"{other[0]}({key}=...)"
            )
        if key in RAY_NOTES:
            raise TuneConfigError(f"{owner}({key}=...): {RAY_NOTES[key]}")
        close = difflib.get_close_matches(str(key), sorted(valid), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TuneConfigError(
            f"{owner} has no field {key!r}{hint} (its fields: {', '.join(sorted(valid))})"
        )
