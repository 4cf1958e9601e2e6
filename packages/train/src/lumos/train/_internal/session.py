"""Worker side: the entry point that runs the user's function in a training session.

The controller launches :func:`run_train_worker` on every worker of a
``lumos.runtime.WorkerGroup``; it runs the user's function in the runtime's user
thread with a ``reporting.TrainSession`` current. What a rank knows about its run is
in ``train_context.py``; the messages between the ranks and the driver are in ``wire.py``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lumos.train._internal import hang_sampler
from lumos.train._internal.errors import NotInTrainingFunctionError
from lumos.train._internal.reporting import CURRENT, TrainSession
from lumos.train._internal.train_context import TrainContext

if TYPE_CHECKING:
    from lumos.runtime import WorkerSession
    from lumos.train._internal.train_context import WorkerRunArgs


class WorkerHooks:
    """Per-worker setup/teardown around the user's function (a backend's worker half)."""

    def on_start(self, context: TrainContext) -> None:
        """Called in the user thread before the training function."""

    def on_end(self, context: TrainContext, error: BaseException | None) -> None:
        """Called in the user thread after the training function."""

    def for_replacement(self) -> WorkerHooks:
        """The hooks of a rank launched alone into a running attempt (peer recovery)."""
        return self


_current = CURRENT


def current_session(api: str) -> TrainSession:
    """The session of the calling training thread; helpful error outside of one.

    Raises:
        NotInTrainingFunctionError: no training function runs in this process (or
            several do and the calling thread belongs to none of them).
    """
    session = _current.get()
    if session is None:
        raise NotInTrainingFunctionError(
            f"lumos.train.{api}() can only be called inside a training function run by a "
            "lumos trainer (e.g. TorchTrainer(train_fn, ...).fit())"
        )
    return session


def run_train_worker(
    train_fn: Callable[..., Any],
    config: dict[str, Any] | None,
    args: WorkerRunArgs,
    hooks: WorkerHooks | None = None,
) -> dict[str, Any]:
    """Entry point launched on every worker: set up the session, run the user's function."""
    from lumos.runtime import worker

    runtime_session = worker.get_session()
    if runtime_session is None or runtime_session.info is None:  # pragma: no cover
        raise RuntimeError("lumos.train worker started outside of a lumos.runtime WorkerGroup")
    return run_in_session(runtime_session, train_fn, config, args, hooks)


def run_in_session(
    runtime_session: WorkerSession,
    train_fn: Callable[..., Any],
    config: dict[str, Any] | None,
    args: WorkerRunArgs,
    hooks: WorkerHooks | None = None,
) -> dict[str, Any]:
    """Run the user's function in this thread with a ``TrainSession`` on ``runtime_session``.

    The body of :func:`run_train_worker`; local mode (``local.py``) calls it with a
    session whose messages its in-process driver handles.
    """
    assert runtime_session.info is not None
    context = TrainContext(runtime_session.info, args)
    session = TrainSession(runtime_session, context, args)
    os.environ["LUMOS_TRAIN_RUN_NAME"] = args.run_name
    _current.activate(session)
    thread_id = threading.get_ident()
    hang_sampler.watch(thread_id, lambda: session.next_index)  # the hang watchdog's view
    error: BaseException | None = None
    try:
        if hooks is not None:
            hooks.on_start(context)
        hang_sampler.enter_user()
        if args.pass_config:
            train_fn(config if config is not None else {})
        else:
            train_fn()
        session.end(ok=True)
    except BaseException as exc:
        error = exc
        session.end(ok=False)
        raise
    finally:
        try:
            if hooks is not None:
                hooks.on_end(context, error)
        finally:
            hang_sampler.unwatch(thread_id)
            _current.deactivate(session)
    return {"attempt": args.attempt, "reports": session.next_index - args.report_index_base}
