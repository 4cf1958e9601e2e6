"""Which stored run a ``fit()`` writes: unique default names and ``RunConfig(if_exists)``.

Train and Tune resolve their run (experiment) the same way, here:

- a generated default name (``"<prefix>-<UTC time>-<6 hex digits>"``) must be new:
  if a run of that name exists, or another live driver holds its lease, another
  name is drawn, so two ``fit()`` calls in the same second (one script, or two
  processes on one storage) never share a run;
- a name the user gave that already holds a run is resumed (``"resume"``, if the
  package's ``matches`` says it is the same job), refused (``"error"``) or left alone
  while this job runs beside it as ``name-2``, ``name-3``, ... (``"new"``, or a
  ``"resume"`` that does not match; a matching run among those is resumed).

The decision is taken under the candidate's lease (an atomic create on local disk and
S3), so two drivers racing for one name cannot both start it as new.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from lumos.storage import Lease, LeaseHeldError, RunStorage

IfExists = Literal["resume", "error", "new"]
IF_EXISTS_CHOICES: tuple[str, ...] = ("resume", "error", "new")

MAX_GENERATED_TRIES = 20
"""Fresh default names drawn before giving up (each clash is a 1 in 16 million event)."""


def unique_run_name(prefix: str) -> str:
    """``"<prefix>-YYYY-mm-dd_HH-MM-SS-<6 hex digits>"`` (UTC): readable and unique."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.gmtime())
    return f"{prefix}-{stamp}-{secrets.token_hex(3)}"


def names_beside(name: str) -> Iterator[str]:
    """``name-2``, ``name-3``, ...: where a job goes when ``name`` holds another one."""
    for n in itertools.count(2):
        yield f"{name}-{n}"


@dataclass
class RunClaim:
    """The run a ``fit()`` writes, with its lease held (release it when done).

    Attributes:
        storage: The run's storage (its name may differ from the one asked for).
        lease: The run's lease, acquired and not yet renewing.
        fresh: True when no run existed there: this job creates it.
    """

    storage: RunStorage
    lease: Lease
    fresh: bool


@dataclass(frozen=True)
class ClaimRules:
    """How one package finds and compares its stored runs.

    Attributes:
        kind: ``"run"`` (Train) or ``"experiment"`` (Tune), for messages.
        exists: Whether a run is stored at a storage (called under its lease).
        matches: ``None`` when the stored run is the same job as this one, else a
            short text saying what differs (Train: always ``None``).
        error: The exception class raised for ``if_exists="error"``.
        say: Prints one plain line (the package's console).
        holder: The lease holder label (default ``host:pid``).
    """

    kind: str
    exists: Callable[[RunStorage], bool]
    matches: Callable[[RunStorage], str | None]
    error: type[Exception]
    say: Callable[[str], None]
    holder: str | None = None


def claim_run(
    storage_at: Callable[[str], RunStorage],
    name: str,
    if_exists: IfExists,
    rules: ClaimRules,
    generated: Callable[[], str] | None = None,
) -> RunClaim:
    """The run to write for ``name`` under ``if_exists``, its lease held.

    Args:
        storage_at: The storage of a run name (same ``storage_path`` and filesystem).
        name: The name asked for (``RunConfig.name``, or a generated one).
        if_exists: ``RunConfig.if_exists``.
        rules: How the package finds and compares runs.
        generated: Draws a fresh default name when ``name`` was generated (it is then
            never resumed: a clash draws another name).

    Raises:
        LeaseHeldError: Another live driver runs the named run (``"resume"``, ``"error"``;
            ``"new"`` goes beside it).
        rules.error: ``if_exists="error"`` and the run exists, or no free name was found.
    """
    if generated is not None:
        return _claim_generated(storage_at, name, rules, generated)
    storage = storage_at(name)
    try:
        lease = storage.acquire_lease(rules.holder)
    except LeaseHeldError:
        if if_exists != "new":
            raise
        return _claim_beside(storage_at, storage, if_exists, rules, None)  # a live one
    try:
        storage.remove_interrupted_writes()  # a killed driver's half writes (its lease's too)
        if not rules.exists(storage):
            return RunClaim(storage, lease, fresh=True)
        if if_exists == "error":
            raise rules.error(refused_text(rules.kind, name, storage.uri))
        why = rules.matches(storage) if if_exists == "resume" else None
        if if_exists == "resume" and why is None:
            return RunClaim(storage, lease, fresh=False)
    except BaseException:
        lease.release()
        raise
    lease.release()
    return _claim_beside(storage_at, storage, if_exists, rules, why)


def _claim_generated(
    storage_at: Callable[[str], RunStorage],
    name: str,
    rules: ClaimRules,
    generated: Callable[[], str],
) -> RunClaim:
    for _ in range(MAX_GENERATED_TRIES):
        storage = storage_at(name)
        try:
            lease = storage.acquire_lease(rules.holder)
        except LeaseHeldError:
            name = generated()
            continue
        if not _exists(storage, lease, rules):
            return RunClaim(storage, lease, fresh=True)
        lease.release()
        name = generated()
    raise rules.error(
        f"no free {rules.kind} name found after {MAX_GENERATED_TRIES} generated names "
        f"(the last: {name!r}); pass RunConfig(name=...)"
    )


def _claim_beside(
    storage_at: Callable[[str], RunStorage],
    taken: RunStorage,
    if_exists: IfExists,
    rules: ClaimRules,
    why: str | None,
) -> RunClaim:
    """A run beside ``taken``: a matching one to resume (``"resume"``), else a new one."""
    for candidate in names_beside(taken.name):
        storage = storage_at(candidate)
        try:
            lease = storage.acquire_lease(rules.holder)
        except LeaseHeldError:
            continue  # a live driver runs it: not ours to resume, not free
        if not _exists(storage, lease, rules):
            rules.say(beside_text(rules.kind, taken, candidate, why, resumed=False))
            return RunClaim(storage, lease, fresh=True)
        try:
            same = if_exists == "resume" and rules.matches(storage) is None
        except BaseException:
            lease.release()
            raise
        if same:
            rules.say(beside_text(rules.kind, taken, candidate, why, resumed=True))
            return RunClaim(storage, lease, fresh=False)
        lease.release()
    raise AssertionError("unreachable: names_beside never ends")  # pragma: no cover


def _exists(storage: RunStorage, lease: Lease, rules: ClaimRules) -> bool:
    try:
        return rules.exists(storage)
    except BaseException:
        lease.release()
        raise


def refused_text(kind: str, name: str, uri: str) -> str:
    """The error of ``RunConfig(if_exists="error")`` finding a stored run."""
    return (
        f"RunConfig(if_exists='error'): a {kind} named {name!r} already exists at {uri}; "
        f"allowed: if_exists='resume' (resume it), 'new' (start a new {kind} beside it) "
        "or 'error' with another RunConfig(name=...)"
    )


def beside_text(
    kind: str, taken: RunStorage, candidate: str, why: str | None, resumed: bool
) -> str:
    """The one line saying that a job runs beside the stored run of its name."""
    if why is None:
        found = f"{kind} {taken.name!r} already exists at {taken.uri}"
        done = f"starting a new {kind} {candidate!r} beside it (RunConfig(if_exists='new'))"
    else:
        found = (
            f"{kind} {taken.name!r} at {taken.uri} is another sweep ({why}); it is kept as it is"
        )
        done = (
            f"resuming the matching {kind} {candidate!r} beside it"
            if resumed
            else f"starting this one as {candidate!r} beside it"
        )
    return f"{found}: {done}"


def finished_text(kind: str, name: str, finished_at: float, uri: str | None = None) -> str:
    """The line of a rerun that finds its run finished and returns the stored result.

    Args:
        kind: ``"run"`` or ``"experiment"``.
        name: The run's name.
        finished_at: When it finished (``time.time()``), shown in local time.
        uri: Where it is stored, if the line should say.

    Example:
        >>> finished_text("run", "x", 0.0)  # doctest: +SKIP
        "run 'x' already finished at 1970-01-01 00:00:00; returning its stored result ..."
    """
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished_at))
    where = f" in {uri}" if uri else ""
    return (
        f"{kind} {name!r}{where} already finished at {when}; returning its stored result "
        "(RunConfig(if_exists='new') runs it again)"
    )
