"""Which stored experiment a ``Tuner.fit()`` opens: the same sweep, or one beside it.

A sweep is identified by its trainable (name), metric, mode, search space (the
searched parameters and their domains; constants may change between runs, as data
paths do) and sampler. ``fit()`` stores these in ``_lumos/tuner.json`` when it
creates the experiment; a later ``fit()`` with the same name compares them with its
own (``RunConfig(if_exists="resume")``, the default) and resumes only the same sweep:
another one is kept untouched and this sweep runs beside it (``name-2``, ...), with
one plain line saying so. ``lumos.runtime.claim_run`` takes the decision under the
experiment's lease; this module says what "exists" and "the same" mean for Tune.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any, Protocol

from lumos.runtime import ClaimRules, RunClaim, claim_run, finished_text, unique_run_name
from lumos.storage import RunStorage
from lumos.tune._internal.config import RunConfig, TuneConfig
from lumos.tune._internal.errors import TuneConfigError
from lumos.tune._internal.experiment import open_experiment, quiet_optuna, study_journal_path
from lumos.tune._internal.journal import FsJournal
from lumos.tune._internal.live_trial import LiveTrial
from lumos.tune._internal.search_space import SearchSpace
from lumos.tune._internal.tuner_state import load_definition


class SweepSpec(Protocol):
    """What :func:`stored_if_finished` reads of a ``Tuner``."""

    space: SearchSpace
    tune_config: TuneConfig
    run_config: RunConfig


logger = logging.getLogger("lumos.tune")

HOLDER = "lumos.tune driver"
"""The lease holder label of a Tune driver."""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FIELDS = ("trainable", "metric", "mode", "space", "sampler")
_MAX_SPACE_ITEMS = 3


def trainable_name(trainable: Callable[..., Any]) -> str:
    """The trial function's name (Ray's ``Trial.trainable_name``)."""
    return str(getattr(trainable, "__name__", type(trainable).__name__))


def default_name(trainable: Callable[..., Any]) -> str:
    """A new experiment name: ``"<trainable name>-<UTC time>-<6 hex digits>"``."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", trainable_name(trainable)).strip("._-")
    return unique_run_name(base or "tune")


def _plain(text: str) -> str:
    """``repr`` without memory addresses (they differ between runs of one script)."""
    return _ADDRESS.sub("", text)


def describe_space(space: SearchSpace) -> dict[str, str]:
    """The searched parameters of ``space`` and their domains, as text.

    Example:
        >>> describe_space(SearchSpace({"lr": tune.loguniform(1e-4, 1e-1), "epochs": 3}))
        {'lr': 'loguniform(0.0001, 0.1)'}
    """
    fn = space.define_by_run
    if fn is not None:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return {"<define-by-run>": f"{getattr(fn, '__module__', '?')}.{name}"}
    out = {"/".join(map(str, path)): _plain(repr(domain)) for path, domain in space.domains}
    for path, function in space.functions:
        out["/".join(map(str, path))] = _plain(repr(function))
    return out


def describe_sweep(
    trainable_name: str, space: SearchSpace, tune_config: TuneConfig
) -> dict[str, Any]:
    """What identifies a sweep (JSON-able): stored at creation, compared on reopen."""
    sampler = tune_config.sampler
    return {
        "trainable": trainable_name,
        "metric": tune_config.metric,
        "mode": tune_config.mode,
        "space": describe_space(space),
        "sampler": type(sampler).__name__ if sampler is not None else "TPESampler",
    }


def differences(stored: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """What differs between the stored sweep and this one (``None``: the same sweep).

    Only what was stored is compared (experiments of earlier versions stored less).
    """
    if stored is None:
        return None
    out: list[str] = []
    for key in _FIELDS:
        if key not in stored or stored[key] == current.get(key):
            continue
        if key == "space" and isinstance(stored[key], dict):
            out.append(_space_difference(stored[key], current.get(key) or {}))
        else:
            label = "search space" if key == "space" else key
            out.append(f"{label} {stored[key]!r} there, {current.get(key)!r} here")
    return "; ".join(out) or None


def _space_difference(stored: dict[str, Any], current: dict[str, Any]) -> str:
    names = sorted(set(stored) | set(current))
    changed = [n for n in names if stored.get(n) != current.get(n)]
    parts = [
        f"{n!r} {stored.get(n, 'absent')} there, {current.get(n, 'absent')} here"
        for n in changed[:_MAX_SPACE_ITEMS]
    ]
    more = len(changed) - _MAX_SPACE_ITEMS
    return "search space: " + ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def experiment_exists(storage: RunStorage) -> bool:
    """Whether an experiment (its Optuna study) is stored there."""
    return FsJournal(storage.fs, study_journal_path(storage)).exists()


def say(run_config: RunConfig) -> Callable[[str], None]:
    """Prints one plain line to the sweep's console (stdout), or logs it when silent."""

    def line(text: str) -> None:
        if run_config.verbose > 0:
            print(f"[lumos.tune] {text}", file=sys.stdout, flush=True)
        else:
            logger.info(text)

    return line


def claim_experiment(
    run_config: RunConfig,
    name: str,
    current: dict[str, Any] | None,
    generated: Callable[[], str] | None,
) -> RunClaim:
    """The experiment this ``fit()`` writes, its lease held (not yet renewing).

    Args:
        run_config: The sweep's ``RunConfig`` (storage, ``if_exists``, verbosity).
        name: The experiment name (``RunConfig.name`` or the generated one).
        current: This sweep's :func:`describe_sweep`, or ``None`` to resume whatever
            is stored (``Tuner.restore``).
        generated: Draws another default name when ``name`` was generated.

    Raises:
        TuneConfigError: ``if_exists="error"`` and the experiment exists.
        lumos.storage.LeaseHeldError: Another live driver runs the named experiment.
    """
    path, fs = run_config.storage_location()

    def matches(storage: RunStorage) -> str | None:
        return None if current is None else differences(load_definition(storage), current)

    rules = ClaimRules(
        kind="experiment",
        exists=experiment_exists,
        matches=matches,
        error=TuneConfigError,
        say=say(run_config),
        holder=HOLDER,
    )
    return claim_run(
        lambda n: RunStorage(path, n, fs), name, run_config.if_exists, rules, generated
    )


def stored_if_finished(storage: RunStorage, sweep: SweepSpec) -> list[LiveTrial] | None:
    """The stored trials of a finished sweep that this one would not extend (and one
    line saying so); ``None`` when the sweep goes on (unfinished, or more trials asked)."""
    state = storage.load_state()
    tc = sweep.tune_config
    if state is None or state.status != "finished" or tc.num_samples == -1:
        return None
    with quiet_optuna():
        exp = open_experiment(storage, sweep.space, tc)
        try:
            trials = list(exp.trials)
        finally:
            exp.close()
    if exp.waiting or len(trials) < tc.num_samples * sweep.space.num_grid_points:
        return None
    text = finished_text("experiment", storage.name, state.updated_at, storage.uri)
    say(sweep.run_config)(text)
    return trials
