"""``trainer.fit()`` in a thread, so that a test can change the cluster meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from lumos import train


class FitThread:
    """Runs ``trainer.fit()`` in a daemon thread; keeps its result or its error.

    Args:
        trainer: The trainer to fit.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.result: train.Result | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._fit, daemon=True)
        self.thread.start()

    def _fit(self) -> None:
        try:
            self.result = self.trainer.fit()
        except BaseException as exc:
            self.error = exc

    def wait(
        self,
        what: str,
        ok: Callable[[], bool],
        timeout_s: float = 120.0,
        detail: Callable[[], Any] = lambda: "",
    ) -> None:
        """Wait until ``ok()``, while ``fit()`` still runs (``detail``: for the message)."""
        deadline = time.monotonic() + timeout_s
        while not ok():
            assert self.thread.is_alive(), f"fit() ended before {what}: {self.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {detail()}"
            time.sleep(0.1)

    def join(self, timeout_s: float = 180.0) -> train.Result:
        """``fit()``'s result once it returned (its error raised)."""
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), "fit() did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
