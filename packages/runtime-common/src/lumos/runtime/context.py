"""Ambient, process-local job context: how a nested job finds its parent.

Tune publishes one for each trial (``with context.running(ctx): objective(config)``);
a Train run started inside reads ``context.current()`` to write under the trial's
directory, forward rank 0's reports and stop when the trial is pruned. Neither
library imports the other; both import this module.

Example:
    >>> import threading
    >>> from lumos.runtime import context
    >>> ctx = context.JobContext(
    ...     kind="tune.trial", name="trial_0001", storage_path="/tmp/exp/trial_0001",
    ...     storage_filesystem=None, report=lambda metrics: None,
    ...     stop_event=threading.Event(), stop_error=lambda: RuntimeError("stopped"))
    >>> with context.running(ctx):
    ...     assert context.current() is ctx
    >>> context.current() is None
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lumos.runtime._internal.errors import RuntimeUsageError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["JobContext", "current", "running"]


@dataclass
class JobContext:
    """What a running job offers to a job nested inside it.

    Attributes:
        kind: Kind of the publishing job, e.g. ``"tune.trial"``.
        name: Its name (e.g. the trial name).
        storage_path: fsspec URL / directory under which nested runs write.
        storage_filesystem: Filesystem for ``storage_path`` (``None``: infer from the URL).
        report: Forwards metrics to the parent. MAY RAISE the parent's stop exception
            (e.g. ``tune.TrialPruned``); the nested job must then stop and re-raise it.
        stop_event: Set when the parent wants the nested job to stop.
        stop_error: Builds the exception a nested job raises when stopped via ``stop_event``.
        resources_hint: Free-form hints (e.g. resources of the trial).
        id: The publishing job's id (a trial's id, ``"00007"``); ``name`` is its name and
            ``storage_path`` its directory (Ray's ``get_trial_id`` / ``get_trial_name`` /
            ``get_trial_dir`` on a nested Train run's context).
        report_checkpoint: Forwards metrics with the checkpoint the nested job committed
            with them (its URL on ``storage_filesystem``), so the parent can return it as
            its own (a Tune trial's ``Result.checkpoint``). ``None``: use ``report``. MAY
            RAISE like ``report``.
        starting_checkpoint: URL of a checkpoint a nested run starts from while it has no
            committed checkpoint of its own (a population-based-training clone, a retry's
            last checkpoint); ``None``: none.
        nested_run_name: The run name a nested job uses when its own config names none.
            The parent changes it to start a fresh nested run (population-based training
            does after a clone, so that the run starts from ``starting_checkpoint``
            instead of resuming its own state).
    """

    kind: str
    name: str
    storage_path: str
    storage_filesystem: AbstractFileSystem | None
    report: Callable[[dict[str, Any]], None]
    stop_event: threading.Event
    stop_error: Callable[[], BaseException]
    resources_hint: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    report_checkpoint: Callable[[dict[str, Any], str], None] | None = None
    starting_checkpoint: str | None = None
    nested_run_name: str = "train"

    def forward(self, metrics: dict[str, Any], checkpoint_url: str | None = None) -> None:
        """Hand one report of the nested job to the parent: through ``report_checkpoint``
        when it committed a checkpoint with it (and the parent takes one), else ``report``.

        Raises:
            Whatever the parent's callable raises (its stop exception, e.g. ``TrialPruned``).
        """
        if checkpoint_url is not None and self.report_checkpoint is not None:
            self.report_checkpoint(metrics, checkpoint_url)
        else:
            self.report(metrics)


_lock = threading.Lock()
_stack: list[JobContext] = []


def current() -> JobContext | None:
    """The innermost job context of this process, or ``None``."""
    with _lock:
        return _stack[-1] if _stack else None


@contextmanager
def running(ctx: JobContext) -> Iterator[JobContext]:
    """Publish ``ctx`` for the duration of the block (nesting allowed).

    The context is process-wide (threads started inside see it too), which matches
    one job per worker process.
    """
    if not isinstance(ctx, JobContext):
        raise RuntimeUsageError(
            f"ctx={ctx!r} is invalid: must be a lumos.runtime.context.JobContext"
        )
    with _lock:
        _stack.append(ctx)
    try:
        yield ctx
    finally:
        with _lock:
            # Remove this ctx even if an inner block left out of order.
            for i in range(len(_stack) - 1, -1, -1):
                if _stack[i] is ctx:
                    del _stack[i]
                    break
