"""The text of the run's console state lines and failure descriptions (pure functions).

The controller and ``fit()`` decide *when* a line is printed (``Console.info``);
this module says *what* it says, so every line of a run can be read in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from lumos.runtime import FailureDecision, WorkerFailure, WorkerInfo, finished_text
from lumos.storage import CheckpointRecord


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 1`` or ``ranks 0, 2``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in sorted(ranks))


def describe_failure(failure: WorkerFailure, workers: Sequence[WorkerInfo]) -> str:
    """``rank 1 on node 10.0.0.2 (1a2b3c4d), pid 4242: worker process died (...)``."""
    if failure.rank < 0:
        return failure.message
    where = ""
    if 0 <= failure.rank < len(workers):
        w = workers[failure.rank]
        where = f" on node {w.node_ip} ({(failure.node_id or w.node_id)[:8]}), pid {w.pid}"
    elif failure.node_id:
        where = f" on node {failure.node_id[:8]}"
    return f"rank {failure.rank}{where}: {failure.message}"


def describe_nodes(workers: Sequence[WorkerInfo]) -> str:
    """``2 node(s): 10.0.0.1, 10.0.0.2``."""
    nodes = sorted({w.node_ip for w in workers})
    return f"{len(nodes)} node(s): {', '.join(nodes)}"


def resume_point(resume: CheckpointRecord | None) -> str:
    """Where an attempt starts: ``checkpoint 'checkpoint_3'`` or the start."""
    return f"checkpoint {resume.dir_name!r}" if resume else "the start (no checkpoint yet)"


def started_line(num_workers: int, seconds: float, workers: Sequence[WorkerInfo]) -> str:
    """The line after a worker group started."""
    return f"started {num_workers} worker(s) in {seconds:.1f} s ({describe_nodes(workers)})"


def restarting_line(decision: FailureDecision, resume: CheckpointRecord | None) -> str:
    """``restarting (failure 1 of 3) from checkpoint 'checkpoint_2'``."""
    return f"restarting ({decision.progress}) from {resume_point(resume)}"


def giving_up_line(decision: FailureDecision) -> str:
    """The line when the failure policy says RAISE."""
    return f"giving up: {decision.reason}"


def replaced_line(ranks: Sequence[int], by_standby: Sequence[int], seconds: float) -> str:
    """How the failed ranks were replaced, and how long it took."""
    fresh = [r for r in ranks if r not in by_standby]
    parts: list[str] = []
    if by_standby:
        parts.append(f"the standby worker took over {ranks_text(by_standby)}")
    if fresh:
        parts.append(f"a new worker process for {ranks_text(fresh)}")
    return f"replaced {ranks_text(ranks)} in {seconds:.2f} s ({'; '.join(parts)})"


def peer_recovery_line(ranks: Sequence[int], seconds: float, decision: FailureDecision) -> str:
    """Peer recovery: the replaced ranks rejoin while the others keep training."""
    return (
        f"{ranks_text(ranks)} rejoin the running attempt in {seconds:.2f} s and take the "
        f"state from a live peer; the other ranks keep training ({decision.reason})"
    )


def vacant_line(vacant: Sequence[int], live: int, size: int) -> str:
    """Peer recovery in an elastic group: lost ranks stay vacant, the others train on."""
    return (
        f"{ranks_text(vacant)}: no room for a new worker yet; {live} of {size} rank(s) train "
        "on (their functions go on), a new worker joins when room comes back"
    )


def peers_joined_line(ranks: Sequence[int]) -> str:
    """Peer recovery: ranks joined the running attempt (room, a move)."""
    return f"{ranks_text(ranks)}: joined the running attempt, taking the state from a live peer"


def join_failed_line(error: BaseException) -> str:
    """Peer recovery: a new worker for a move or a vacant rank did not start."""
    return (
        f"a new worker for a rank that moves or joins did not start ({type(error).__name__}: "
        f"{error}); the ranks train on as they are, and it is tried again"
    )


def moved_live_line(ranks: Sequence[int]) -> str:
    """Peer recovery: ranks under a preemption notice moved while the others trained."""
    return (
        f"{ranks_text(ranks)} under a preemption notice: moved to a new worker, which takes "
        "the state from a live peer; the other ranks keep training"
    )


def replace_failed_line(error: BaseException) -> str:
    """The line when replacing failed ranks did not work."""
    return (
        f"replacing the failed workers did not work ({type(error).__name__}: {error}); "
        "starting a new worker group"
    )


def finished_line(name: str, reports: int, latest: CheckpointRecord | None, uri: str) -> str:
    """The last line of a finished run."""
    return (
        f"finished run {name!r}: {reports} report(s)"
        + (f", latest checkpoint {latest.dir_name!r}" if latest else "")
        + f"; results in {uri}"
    )


def interrupted_line(name: str, why: str = "interrupted") -> str:
    """The line after Ctrl-C (or SIGTERM to the driver)."""
    return (
        f"{why}; the workers stopped and the run state is saved: run {name!r} resumes from its latest checkpoint "
        "when fit() is called again with the same RunConfig(storage_path, name)"
    )


def starting_line(name: str, uri: str) -> str:
    """The first line of a new run."""
    return f"starting run {name!r} in {uri}"


def already_finished_line(name: str, uri: str, finished_at: float) -> str:
    """The line when ``fit()`` finds the run finished (``finished_at``: its state's time)."""
    return finished_text("run", name, finished_at, uri)


def resuming_line(
    name: str, status: str, latest: CheckpointRecord | None, removed: Sequence[str]
) -> str:
    """The line when ``fit()`` resumes an unfinished run."""
    where = f"checkpoint {latest.dir_name!r}" if latest else "the start (no checkpoint)"
    return f"resuming run {name!r} (it was {status}) from {where}" + (
        f"; removed unfinished upload(s) {list(removed)}" if removed else ""
    )


def trial_lease_wait_line(name: str, holder: str, host: str, pid: int, wait_s: float) -> str:
    """A Tune trial's run waits for the lease its previous driver left to expire."""
    return (
        f"run {name!r} is still leased by {holder!r} (host {host!r}, pid {pid}), the "
        f"trial's previous driver; waiting {wait_s:.1f} s for that lease to expire"
    )


def cleanup_failed_line(error: BaseException) -> str:
    """A cleanup step failed (the run's own outcome is reported as it is)."""
    return f"cleanup step failed: {type(error).__name__}: {error}"


def rollback_line(
    check: str,
    reason: str,
    source: str,
    index: int,
    target: CheckpointRecord | None,
    rolled_back: Sequence[str],
    number: int,
    limit: int,
) -> str:
    """``health check NonFiniteMetric('loss') fired on report #7: ...; rolling back ...``."""
    what = "report" if source == "report" else "the validation of report"
    limit_text = "unlimited" if limit < 0 else f"{number} of {limit}"
    gone = f"; rolled back {', '.join(repr(n) for n in rolled_back)}" if rolled_back else ""
    return (
        f"health check {check} fired on {what} #{index}: {reason}; rolling back "
        f"(rollback {limit_text}) to {resume_point(target)}{gone}"
    )


def rolled_back_line(target: CheckpointRecord | None, seconds: float) -> str:
    """The line once training runs again after a rollback."""
    return f"training resumed from {resume_point(target)} {seconds:.2f} s after the check fired"


def rollbacks_exhausted_text(check: str, reason: str, index: int, limit: int) -> str:
    """Why the run fails when a check fires with no rollback left."""
    return (
        f"health check {check} fired on report #{index} ({reason}) and the run already "
        f"rolled back FailureConfig(max_rollbacks={limit}) time(s); raise max_rollbacks "
        "or fix what makes the check fire"
    )


def validation_line(dir_name: str, status: str, error: str | None) -> str:
    """A validation that did not succeed (training goes on)."""
    what = "timed out" if status == "timeout" else "failed"
    return f"validation of checkpoint {dir_name!r} {what}: {error}; training goes on"


def waiting_validations_line(count: int) -> str:
    """Every rank finished; the run waits for its last validations."""
    return f"training finished; waiting for {count} checkpoint validation(s)"


def training_done_line(count: int) -> str:
    """A resumed run whose training had finished: it only runs what was left."""
    return (
        f"training had finished before the driver stopped: running the {count} "
        "checkpoint validation(s) left; the training function does not run again"
    )


def preempted_line(
    rank: int, node_id: str | None, reason: str, seconds_left: float | None, now: bool = False
) -> str:
    """A rank got a preemption notice (not a failure); ``now``: it moves at once (peers)."""
    node = f" on node {node_id[:8]}" if node_id else ""
    left = f", {seconds_left:.0f} s before its deadline" if seconds_left is not None else ""
    when = "to a new worker now" if now else "right after the next committed checkpoint"
    return (
        f"rank {rank}{node} got a preemption notice ({reason}{left}); it moves {when} "
        "(train.get_preemption_info() tells the function)"
    )


def grow_started_line(added: int, world_size: int, size: int) -> str:
    """Workers were started for a larger group; it grows at the next checkpoint."""
    return (
        f"started {added} more worker(s); the group grows from {world_size} to {size} "
        "worker(s) right after the next committed checkpoint"
    )


def resize_line(reason: str, before: int, after: int, seconds: float) -> str:
    """The group changed size (or moved) at a checkpoint boundary or after a loss."""
    what = (
        f"resized from {before} to {after} worker(s)"
        if before != after
        else (f"kept {after} worker(s)")
    )
    return f"{what} in {seconds:.2f} s ({reason})"


def resumed_after_resize_line(size: int, resume: CheckpointRecord | None, seconds: float) -> str:
    """Training runs again after a resize or move."""
    return (
        f"training resumed at {size} worker(s) from {resume_point(resume)}, "
        f"{seconds:.2f} s after the change began"
    )


def waiting_min_workers_line(have: int, min_workers: int) -> str:
    """An elastic group fell below min_workers and waits for capacity."""
    return (
        f"{have} worker(s) left, below min_workers={min_workers}: waiting for resources "
        "to start more"
    )


def launch_failed_line(error: BaseException) -> str:
    """A step of starting an attempt failed (the failure policy decides what follows)."""
    return f"{type(error).__name__}: {error}"


def gave_up_line(text: str) -> str:
    """The line when the run ends without a retry for a reason of its own."""
    return f"giving up: {text}"


def validations_again_line(count: int) -> str:
    """A resumed run runs the validations its previous driver left pending."""
    return f"running {count} unfinished checkpoint validation(s) again"


NO_VALIDATION_CONFIG = "this fit() has no validation_config, so it could not run again"
"""Why a pending validation of a resumed run failed."""


def removed_uploads_line(removed: Sequence[str]) -> str:
    """An ended run removed checkpoint uploads that never committed."""
    return f"removed unfinished checkpoint upload(s) {list(removed)}"


def moving_line(reason: str) -> str:
    """A fixed-size group moves (starts anew) at a checkpoint boundary."""
    return f"moving every rank to a new group ({reason})"


def grow_reason_text(extra: int, reason: str) -> str:
    """Why an elastic group grows at the next checkpoint (the resize line shows it)."""
    return f"capacity for {extra} more worker(s) ({reason})"


def local_line(world_size: int) -> str:
    """The first line of a local-mode attempt."""
    if world_size == 1:
        return "local mode (num_workers=0): running the training function in this process"
    return (
        f"local mode under torchrun: {world_size} ranks, one per process; "
        "rank 0 commits the checkpoints"
    )


def run_failed_text(name: str, message: str) -> str:
    """The text of a ``TrainingFailedError``."""
    return f"Training run {name!r} failed: {message}"


def storage_failed_text(error: BaseException) -> str:
    """Why a run failed when its storage did."""
    return f"storage failed: {error}"


def launch_failure_text(step: str, error: BaseException) -> str:
    """The failure of a step of starting an attempt (``WorkerFailure.message``)."""
    return f"could not {step}: {type(error).__name__}: {error}"


TORCHRUN_WAIT_TEXT = (
    "under torchrun, a checkpoint uploaded with checkpoint_upload_mode=ASYNC is committed "
    "(and a validation's end is announced) at the ranks' next train.report() (or when the "
    "function returns); call get_all_reported_checkpoints() after that report, or use "
    "checkpoint_upload_mode=SYNC and consistency_mode=COMMITTED"
)
"""Why a wait for a notice fails under torchrun (no rank can commit alone)."""


def uneven_ranks_text(ended: Sequence[int], still: Sequence[int]) -> str:
    """Local mode: some ranks returned while others still report."""
    return (
        f"rank(s) {list(ended)} returned while rank(s) {list(still)} still call "
        "train.report(); every rank must call train.report() the same number of times"
    )


def upload_failed_text(ranks: Sequence[int]) -> str:
    """Local mode: a rank's background checkpoint upload failed."""
    return f"the checkpoint upload of rank(s) {list(ranks)} failed"


def hang_exit_line(code: int) -> str:
    """Local mode / torchrun: the watchdog failed the run; the stuck process exits."""
    return (
        f"lumos.train: a stuck training thread cannot be stopped inside its process: the "
        f"run is marked failed and this process exits with status {code} (torchrun "
        "--max-restarts restarts the ranks; a rerun of fit() resumes from the latest "
        "checkpoint)"
    )


def restart_text(
    attempt: int,
    *,
    first_launch: bool,
    after: str | None,
    kept_group: bool,
    replaced: Sequence[int],
    by_standby: Sequence[int],
) -> str:
    """How an attempt started, as its record says (``AttemptRecord.restart``):
    ``first launch``, ``new group``, ``replaced rank 1 (standby)``, ``rollback, same
    workers``, ``resize, new group``, ``resumed by a new fit(), new group``."""
    if first_launch:
        return "first launch" if attempt == 0 else "resumed by a new fit(), new group"
    how = "new group"
    if kept_group:
        fresh = [r for r in replaced if r not in by_standby]
        parts = [f"{ranks_text(by_standby)} by standby"] if by_standby else []
        parts += [f"{ranks_text(fresh)} by a new process"] if fresh else []
        how = f"replaced {'; '.join(parts)}" if parts else "same workers"
    return f"{after}, {how}" if after else how
