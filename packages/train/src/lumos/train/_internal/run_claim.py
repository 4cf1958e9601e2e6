"""Which stored run a Train ``fit()`` writes, and its state.

The run is ``RunConfig(storage_path, name)``: a stored run of that name is resumed
(as Ray Train V2 does), unless ``RunConfig(if_exists)`` says ``"error"`` (refuse)
or ``"new"`` (start a new run beside it, ``name-2``, ...). Without a name each
``fit()`` gets a new unique one (``train-<UTC time>-<6 hex digits>``); inside a Tune
trial the default is ``"train"``, so a resumed trial resumes its run.
``lumos.runtime.claim_run`` takes the decision under the run's lease.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lumos.runtime import ClaimRules, RunClaim, claim_run, context as job_context, unique_run_name
from lumos.storage import Lease, LeaseHeldError, RunState, RunStorage
from lumos.train._internal.config import RunConfig
from lumos.train._internal.console import Console
from lumos.train._internal.controller import messages
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.local_exchange import has_torchrun_env


def default_run_name() -> str:
    """A new readable unique run name: ``train-2026-11-29_17-40-03-a1b2c3`` (UTC)."""
    return unique_run_name("train")


def torchrun_run_name() -> str:
    """The default run name under torchrun: ``train-torchrun-<TORCHELASTIC_RUN_ID>``.

    Every rank computes the same name on its own (a random one per rank would split
    the run), and a torchrun restart (``--max-restarts``), which keeps the run id,
    resumes the same run.

    Raises:
        TrainConfigError: The launcher set no ``TORCHELASTIC_RUN_ID`` (not torchrun).
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("._-")[:48]
    if not safe:
        raise TrainConfigError(
            "RunConfig(name=None) with RANK/WORLD_SIZE set but no TORCHELASTIC_RUN_ID: "
            "the ranks cannot agree on a default run name; pass RunConfig(name=...) "
            "(the same on every rank), or launch with torchrun"
        )
    return f"train-torchrun-{safe}"


@dataclass
class ClaimedRun:
    """The run a ``fit()`` writes.

    Attributes:
        storage: The run's storage.
        where: ``(storage_path, filesystem)`` as configured (what workers open).
        lease: The run's lease when held (``None`` under torchrun's other ranks, and
            once released for local mode, whose runner takes it itself).
        fresh: No run was stored there when it was claimed: this ``fit()`` starts it.
    """

    storage: RunStorage
    where: tuple[str, Any]
    lease: Lease | None
    fresh: bool


def claim_train_run(rc: RunConfig, console: Console, local_mode: bool) -> ClaimedRun:
    """Resolve the run of ``rc`` (Tune trial defaults included) and take its lease.

    Args:
        rc: The trainer's ``RunConfig``.
        console: Where the one line about a new name goes.
        local_mode: ``ScalingConfig(num_workers=0)``. Under ``torchrun`` (each process
            one rank) rank 0 decides, other ranks only use the configured name, and
            ``if_exists="new"`` is refused (the ranks could not agree on a new name).

    Raises:
        TrainConfigError: ``if_exists="error"`` and the run exists, or ``"new"``
            under torchrun.
        lumos.storage.LeaseHeldError: Another live driver runs the named run.
    """
    ctx = job_context.current()
    parent = (ctx.storage_path, ctx.storage_filesystem) if ctx is not None else (None, None)
    path, fs = rc.storage_location(*parent)
    generated: Callable[[], str] | None = None
    if rc.name is not None:
        name = rc.name
    elif ctx is not None:
        name = ctx.nested_run_name
    elif local_mode and has_torchrun_env():
        name = torchrun_run_name()  # every rank the same, without exchanging it
    else:
        name = default_run_name()
        generated = default_run_name

    def storage_at(run_name: str) -> RunStorage:
        return RunStorage(path, run_name, fs)

    if local_mode and has_torchrun_env():
        if rc.if_exists == "new":
            raise TrainConfigError(
                "RunConfig(if_exists='new') under torchrun: each process would pick its "
                "own new name; pass the new run's RunConfig(name=...) instead, or "
                "if_exists='resume' / 'error'"
            )
        if os.environ.get("RANK", "0") != "0":
            return ClaimedRun(storage_at(name), (path, fs), None, fresh=False)
    rules = ClaimRules(
        kind="run",
        exists=lambda storage: storage.load_state() is not None,
        matches=lambda storage: None,  # a Train run is its name (Ray Train V2)
        error=TrainConfigError,
        say=console.info,
    )
    claim = _claim(storage_at, name, rc, rules, generated, in_trial=ctx is not None, say=console)
    return ClaimedRun(claim.storage, (path, fs), claim.lease, claim.fresh)


#: How many times a Tune trial's run waits for a previous holder's lease to expire.
TRIAL_LEASE_WAITS = 2


def _claim(
    storage_at: Callable[[str], RunStorage],
    name: str,
    rc: RunConfig,
    rules: ClaimRules,
    generated: Callable[[], str] | None,
    in_trial: bool,
    say: Console,
) -> RunClaim:
    """``claim_run``; inside a Tune trial, a held lease is waited out (bounded).

    A resumed sweep holds its experiment's lease, so the driver that started the
    trial's run before is gone; the run's lease its trial actor held can still be
    running out (up to its ``ttl_s``). The trial waits for that expiry, twice at most,
    instead of failing; a holder that still renews is refused as before.
    """
    for waits in range(TRIAL_LEASE_WAITS + 1):
        try:
            return claim_run(storage_at, name, rc.if_exists, rules, generated)
        except LeaseHeldError as exc:
            if not in_trial or waits == TRIAL_LEASE_WAITS:
                raise
            wait_s = max(exc.expires_in_s, 0.0) + LEASE_MARGIN_S
            say.info(messages.trial_lease_wait_line(name, exc.holder, exc.host, exc.pid, wait_s))
            time.sleep(wait_s)
    raise AssertionError("unreachable")  # pragma: no cover


#: Past a lease's expiry before a waiting trial tries again (clocks and S3 listing).
LEASE_MARGIN_S = 0.5


def load_or_create_state(storage: RunStorage, console: Console, fresh: bool = False) -> RunState:
    """The run's stored state (cleaned up to resume it), or a new one.

    Args:
        storage: The run (its lease held).
        console: Prints the starting / resuming line.
        fresh: The run was claimed as new: finding a state now means another driver
            created a run of the same name meanwhile, which is an error, not a resume.

    Raises:
        TrainConfigError: ``fresh`` and a state exists.
    """
    state = storage.load_state()
    if state is not None and fresh:
        raise TrainConfigError(
            f"run {storage.name!r} at {storage.uri} was created by another driver "
            "while this fit() started it; run fit() again (it then follows "
            "RunConfig(if_exists=...)) or pass another RunConfig(name=...)"
        )
    if state is None:
        state = RunState(name=storage.name)
        storage.save_state(state)
        console.info(messages.starting_line(storage.name, storage.uri))
    elif state.status != "finished":
        removed = storage.delete_uncommitted()
        console.info(messages.resuming_line(storage.name, state.status, state.latest(), removed))
    return state
