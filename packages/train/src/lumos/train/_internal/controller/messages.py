"""The text of the run's console state lines and failure descriptions (pure functions).

The controller and ``fit()`` decide *when* a line is printed (``Console.info``);
this module says *what* it says, so every line of a run can be read in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from lumos.runtime import FailureDecision, WorkerFailure, WorkerInfo
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


def interrupted_line(name: str) -> str:
    """The line after Ctrl-C."""
    return (
        f"interrupted; run {name!r} resumes from its latest checkpoint "
        "when fit() is called again with the same RunConfig(storage_path, name)"
    )


def starting_line(name: str, uri: str) -> str:
    """The first line of a new run."""
    return f"starting run {name!r} in {uri}"


def already_finished_line(name: str, uri: str) -> str:
    """The line when ``fit()`` finds the run finished."""
    return (
        f"run {name!r} in {uri} already finished; returning its "
        "result without training. To train again, pass a new "
        "RunConfig(name=...) or delete that directory."
    )


def resuming_line(
    name: str, status: str, latest: CheckpointRecord | None, removed: Sequence[str]
) -> str:
    """The line when ``fit()`` resumes an unfinished run."""
    where = f"checkpoint {latest.dir_name!r}" if latest else "the start (no checkpoint)"
    return f"resuming run {name!r} (it was {status}) from {where}" + (
        f"; removed unfinished upload(s) {list(removed)}" if removed else ""
    )


def cleanup_failed_line(error: BaseException) -> str:
    """A cleanup step failed (the run's own outcome is reported as it is)."""
    return f"cleanup step failed: {type(error).__name__}: {error}"
