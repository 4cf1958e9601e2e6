"""Concise console state lines (stderr), through the ``lumos.train`` logger."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("lumos.train")


class _StderrHandler(logging.Handler):
    """Writes to the *current* ``sys.stderr`` (which notebooks and pytest replace)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def _ensure_handler() -> None:
    if any(isinstance(h, _StderrHandler) for h in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("[lumos.train] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class Console:
    """Prints state lines when ``verbose`` (``RunConfig.verbose``) is 1 or more.

    With ``verbose=0`` the lines are logged at DEBUG only; warnings always show.
    """

    def __init__(self, verbose: int) -> None:
        self.verbose = int(verbose)
        if self.verbose:
            _ensure_handler()

    def info(self, message: str) -> None:
        """A state line."""
        logger.log(logging.INFO if self.verbose else logging.DEBUG, message)

    def warning(self, message: str) -> None:
        """Something went wrong that does not change the run's outcome."""
        logger.warning(message)
