"""SIGTERM to the driver during ``fit()``: the run stops as on Ctrl-C, then the process
exits with status 143 (128 + SIGTERM), as a job scheduler expects.

The handler raises :class:`DriverTerminated` in the main thread. When the signal lands
while that thread is inside Ray's C code (``ray.wait``, ``ray.get``), Ray replaces what
the handler raised with a plain ``KeyboardInterrupt`` (its ``check_status``), so the
handler also records the signal, and :func:`is_termination` answers for either.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from lumos.train._internal.errors import DriverTerminated

T = TypeVar("T")

EXIT_STATUS = 128 + signal.SIGTERM
"""The driver's exit status after a SIGTERM stopped the run."""

_received = threading.Event()


def is_termination(error: BaseException) -> bool:
    """Whether ``error`` is the driver's SIGTERM (however Ray passed it on)."""
    if isinstance(error, DriverTerminated):
        return True
    return isinstance(error, KeyboardInterrupt) and _received.is_set()


@contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`DriverTerminated` in the main thread.

    Only where Python delivers signals: elsewhere (``fit()`` in another thread) a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()

    def stop(signum: int, frame: Any) -> None:
        _received.set()
        raise DriverTerminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_stopping_on_sigterm(run: Callable[[], T]) -> T:
    """``run()`` (a controller's run: it stops the workers and saves the run state on
    ``KeyboardInterrupt``), exiting the process with :data:`EXIT_STATUS` when a SIGTERM
    stopped it; a Ctrl-C stays a ``KeyboardInterrupt``."""
    try:
        with sigterm_stops_the_run():
            return run()
    except KeyboardInterrupt as error:
        if is_termination(error):
            raise SystemExit(EXIT_STATUS) from None
        raise
