"""The worker actor shared by WorkerGroup (gang, ranks) and WorkerPool (independent).

A threaded actor (``max_concurrency``): the owner keeps one long-poll ``poll`` call
outstanding while ``launch``/``deliver``/``request_stop``/``execute`` calls run on
other threads, and the user function runs in its own thread.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

# Imported here, not lazily in poll(): a user thread importing a big module (torch) holds
# the import lock for seconds, and the poll path must never wait for it.
from ray import cloudpickle

from lumos.runtime._internal.errors import RemoteError
from lumos.runtime._internal.preemption import (
    PreemptionBox,
    PreemptionInfo,
    install_sigterm_notice,
)
from lumos.runtime._internal.session import (
    ERROR,
    PREEMPT,
    EventQueue,
    RawEvent,
    WorkerInfo,
    WorkerSession,
    run_user_fn,
)

ACTOR_MAX_CONCURRENCY = 16
# How long an owner->worker message waits for its predecessors (calls on a threaded
# actor may start slightly out of order; messages carry a sequence number).
_ORDER_WAIT_S = 30.0


def _unbox(box: list[Any]) -> Any:
    """The value in a one-item list: fetched (and unpickled) when it is an ObjectRef."""
    import ray

    value = box[0]
    return ray.get(value) if isinstance(value, ray.ObjectRef) else value


# How long launch() waits for the previous user thread, which has queued its outcome, to end.
_PREVIOUS_THREAD_GRACE_S = 2.0


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:
        return socket.gethostbyname(socket.gethostname())


def serialize_batch(batch: list[RawEvent]) -> bytes:
    """Pickle a batch of raw events; an unpicklable event becomes an ERROR event."""
    try:
        return pickle.dumps(batch, protocol=5)
    except Exception:
        pass
    try:
        return bytes(cloudpickle.dumps(batch, protocol=5))  # type: ignore[no-untyped-call]
    except Exception:
        pass
    safe: list[RawEvent] = []
    for item in batch:
        try:
            cloudpickle.dumps(item, protocol=5)  # type: ignore[no-untyped-call]
            safe.append(item)
        except Exception as exc:
            err = RemoteError.from_exception(
                TypeError(
                    f"a value sent to the owner (event kind {item[0]!r}) does not pickle: {exc}"
                )
            )
            safe.append((ERROR, -1, err))
    return bytes(cloudpickle.dumps(safe, protocol=5))  # type: ignore[no-untyped-call]


class WorkerActor:
    """Ray actor class (wrapped with ``ray.remote`` by the owner side)."""

    def __init__(self) -> None:
        self._outbox = EventQueue()
        self._session: WorkerSession | None = None
        self._thread: threading.Thread | None = None
        self._order = threading.Condition(threading.Lock())
        self._next_msg = 0
        self._fn_cache: dict[str, Callable[..., Any]] = {}
        self._rank: int | None = None
        # How long an argument-less poll() waits (set_poll_wait; the floor of
        # long_poll_wait_s until then, so an early poll is never overdue).
        self._poll_wait_s = 0.2
        # SIGTERM becomes a preemption notice once setup(preemption_notices=True) ran
        # (group workers); until then, and on pool workers, it ends the process as before.
        # The handler is installed here: __init__ runs in the actor's main thread.
        self._preemption = PreemptionBox()
        self._notices = False
        self._node_id: str | None = None
        install_sigterm_notice(self._on_sigterm)

    # -- setup ------------------------------------------------------------------------
    def setup(
        self,
        env_vars: dict[str, str] | None,
        imports: list[str] | None = None,
        preemption_notices: bool = False,
    ) -> dict[str, Any]:
        """Apply env vars, import ``imports`` (a standby warms up so), and return where
        this worker runs (one call per actor). A module that fails to import is skipped:
        the user function will raise the error itself if it needs that module.
        With ``preemption_notices``, a SIGTERM of this process is a preemption notice."""
        self._notices = preemption_notices
        if env_vars:
            os.environ.update(env_vars)
        for module in imports or ():
            with contextlib.suppress(Exception):
                importlib.import_module(module)
        import ray

        ctx = ray.get_runtime_context()
        self._node_id = ctx.get_node_id()
        gpu_ids: list[int] = []
        for g in ray.get_gpu_ids():
            try:
                gpu_ids.append(int(g))
            except (TypeError, ValueError):
                continue
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": _node_ip(),
            "pid": os.getpid(),
            "gpu_ids": gpu_ids,
        }

    # -- ordered owner->worker messages -----------------------------------------------
    def _in_order(self, seq: int, action: Callable[[], None]) -> None:
        deadline = time.monotonic() + _ORDER_WAIT_S
        with self._order:
            while self._next_msg < seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break  # predecessor lost; do not block forever
                self._order.wait(remaining)
            try:
                action()
            finally:
                self._next_msg = max(self._next_msg, seq + 1)
                self._order.notify_all()

    def launch(
        self,
        seq: int,
        fn_key: str,
        fn_box: list[Any],
        args_box: list[Any],
        rank_kwargs: dict[str, Any] | None,
        info: WorkerInfo | None,
        session_info: dict[str, Any] | None,
    ) -> None:
        """Start the user function in a new thread (errors become ERROR events).

        ``fn_box`` / ``args_box`` hold an ObjectRef (or the value) in a list so Ray does
        not resolve it before the call: the function is fetched once per actor.
        """
        self._in_order(
            seq, lambda: self._launch(fn_key, fn_box, args_box, rank_kwargs, info, session_info)
        )

    def _launch(
        self,
        fn_key: str,
        fn_box: list[Any],
        args_box: list[Any],
        rank_kwargs: dict[str, Any] | None,
        info: WorkerInfo | None,
        session_info: dict[str, Any] | None,
    ) -> None:
        self._rank = info.world_rank if info is not None else None
        outbox = self._outbox
        try:
            if self._thread is not None:
                # A thread that queued its outcome (the owner saw it and launches again)
                # may not have returned yet: give it a moment to end.
                self._thread.join(_PREVIOUS_THREAD_GRACE_S)
                if self._thread.is_alive():
                    raise RuntimeError(
                        "launch() on a worker whose previous function is still running"
                    )
            session = WorkerSession(info, session_info, outbox, self._preemption)
        except BaseException as exc:
            outbox.put((ERROR, -1, RemoteError.from_exception(exc, rank=self._rank)))
            return
        self._session = session
        rank = self._rank

        def make_error(exc: BaseException) -> RemoteError:
            return RemoteError.from_exception(exc, rank=rank)

        def resolve_and_run() -> Any:
            # Unpickling the function imports the user's module (torch, lightning, ...):
            # seconds, or a minute on a starved CPU. It runs here, in the user thread, so
            # this launch call returns at once and the owner's long-polls keep answering:
            # a slow import is never taken for a hung worker. Its errors are ERROR events.
            fn = self._fn_cache.get(fn_key)
            if fn is None:
                fn = _unbox(fn_box)
                self._fn_cache = {fn_key: fn}  # keep only the latest function
            args, kwargs = _unbox(args_box)
            return fn(*args, **{**kwargs, **(rank_kwargs or {})})

        thread = threading.Thread(
            target=run_user_fn,
            args=(session, resolve_and_run, (), {}, outbox, make_error),
            name="lumos-user-fn",
            daemon=True,
        )
        self._thread = thread
        thread.start()

    def launch_poll(
        self,
        seq: int,
        fn_key: str,
        fn_box: list[Any],
        args_box: list[Any],
        session_info: dict[str, Any] | None,
        max_wait_s: float,
    ) -> bytes:
        """``launch`` then ``poll`` in one call: a short function's events come back in
        the reply (one round trip per run).

        The owner calls it only while no ``poll`` call of its own is outstanding, so this
        call is the only reader of the outbox until it returns.
        """
        started = time.monotonic()
        self.launch(seq, fn_key, fn_box, args_box, None, None, session_info)
        return self.poll(max(0.0, max_wait_s - (time.monotonic() - started)))

    def launch_poll_packed(self, packed: tuple[Any, ...]) -> bytes:
        """:meth:`launch_poll` with its six arguments in one tuple: Ray serializes one
        argument per call instead of six (a ``WorkerPool`` launches every trial so)."""
        return self.launch_poll(*packed)

    def preload(self, fn_key: str, fn_box: list[Any], args_box: list[Any]) -> None:
        """Fetch and unpickle a function and its arguments ahead of a launch (a standby
        does this so that taking over a rank imports nothing); the arguments are
        dropped again, only the modules they needed stay imported."""
        try:
            fn = _unbox(fn_box)
            _unbox(args_box)  # unpickled for the imports it needs, then dropped
        except Exception:
            return  # launch() fetches them again and reports the error
        self._fn_cache = {fn_key: fn}

    def deliver(self, seq: int, value: Any) -> None:
        """Put ``value`` into the running session's inbox."""

        def action() -> None:
            if self._session is not None:
                self._session.deliver(value)

        self._in_order(seq, action)

    def request_stop(self, seq: int) -> None:
        """Ask the running user function to stop (sets the flag, wakes ``receive``)."""

        def action() -> None:
            if self._session is not None:
                self._session.request_stop()

        self._in_order(seq, action)

    def mark_preempted(self, seq: int, info: PreemptionInfo | None) -> None:
        """The owner's view of the group's preemption notices (``None``: none now)."""
        self._in_order(seq, lambda: self._preemption.set_group(info))

    def _on_sigterm(self, deadline_ms: int) -> bool:
        """SIGTERM handler body (main thread): record the notice, tell the owner."""
        if not self._notices:
            return False
        ranks = [] if self._rank is None else [self._rank]
        self._preemption.set_own(PreemptionInfo(deadline_ms, {self._node_id or "": ranks}))
        self._outbox.put((PREEMPT, -1, (deadline_ms, "SIGTERM")))
        return True

    def deliver_control(self, key: tuple[str, int], value: Any) -> None:
        """Answer a barrier / broadcast (owner relay)."""
        if self._session is not None:
            self._session.deliver_control(key, value)

    # -- owner polls ------------------------------------------------------------------
    def set_poll_wait(self, max_wait_s: float) -> None:
        """How long an argument-less :meth:`poll` waits for events."""
        self._poll_wait_s = max_wait_s

    def poll(self, max_wait_s: float | None = None) -> bytes:
        """Long-poll: every queued event (a batch), waiting up to ``max_wait_s``.

        The owner's health-checked polls pass no argument: Ray deserializes a call's
        arguments under a process-wide lock that it also holds while the user thread
        unpickles (and so imports) the user's function, so a poll with arguments would
        wait for ``import torch`` and the worker would look hung.
        """
        wait = self._poll_wait_s if max_wait_s is None else max_wait_s
        return serialize_batch(self._outbox.drain(wait))

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the user thread to end; True when it has."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    # -- execute (in the actor, not in the user thread) -------------------------------
    def execute(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``fn`` and return its result (exceptions propagate as Ray task errors)."""
        return fn(*args, **kwargs)

    def execute_tagged(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[bool, Any]:
        """Run ``fn``; ``(True, result)`` or ``(False, RemoteError)``."""
        try:
            return True, fn(*args, **kwargs)
        except BaseException as exc:
            return False, RemoteError.from_exception(exc, rank=self._rank)

    def ping(self) -> int:
        return os.getpid()
