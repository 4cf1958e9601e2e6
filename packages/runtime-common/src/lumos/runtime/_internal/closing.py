"""The shutdown-on-exit protocol shared by worker groups, pools and their fakes."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

import ray

_Self = TypeVar("_Self", bound="ShutsDownOnExit")

#: Grace period for a ``with`` block that ends normally; one that raises kills at once.
EXIT_GRACE_PERIOD_S = 5.0


class ShutsDownOnExit:
    """``with owner:`` shuts the owner down on exit (at once when the block raised).

    Subclasses implement ``shutdown(grace_period_s)``; those holding Ray resources set
    ``self._closed = False`` once they hold them, and a forgotten owner is then shut
    down when it is garbage-collected (never raising from the finalizer).
    """

    def shutdown(self, grace_period_s: float = EXIT_GRACE_PERIOD_S) -> None:
        """Release everything the owner holds."""
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown(grace_period_s=0.0 if exc is not None else EXIT_GRACE_PERIOD_S)

    def __del__(self) -> None:
        # Last resort when the owner forgot shutdown().
        if not getattr(self, "_closed", True) and ray.is_initialized():
            try:
                self.shutdown(grace_period_s=0.0)
            except Exception:
                pass
