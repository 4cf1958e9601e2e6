"""How the hang watchdog looks into the ranks: samples and stacks from every worker.

:class:`HangProbe` is what the watchdog component needs; :class:`RayHangProbe` asks a
``lumos.runtime.WorkerGroup``'s actors (``execute_async``: the call runs in the actor,
not in the training thread, so a stuck training thread still answers) and never
blocks the driver: a request is sent, and its answers are picked up as they come on
later polls. A worker that answers nothing is the health check's business
(``WorkerHungEvent``), not the watchdog's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from lumos.train._internal import hang_sampler
from lumos.train._internal.hang_sampler import Sample


class HangProbe(Protocol):
    """Samples and stacks of the running group's ranks."""

    def poll(self) -> dict[int, Sample]:
        """The samples answered since the last poll (by rank); sends the next request
        as soon as every rank answered the previous one. Never blocks."""
        ...

    def stacks(self, timeout_s: float) -> dict[int, str]:
        """Every rank's Python stacks (all threads), waiting up to ``timeout_s``."""
        ...

    def reset(self) -> None:
        """Forget requests in flight (a new attempt, a new group)."""


class RayHangProbe:
    """A :class:`HangProbe` over the controller's current Ray worker group.

    Args:
        group: Returns the running group (``None`` when there is none); only a group
            with ``execute_async`` (a ``WorkerGroup``) can be probed.
    """

    def __init__(self, group: Callable[[], Any]) -> None:
        self._group = group
        self._pending: dict[int, Any] = {}

    def _send(self, fn: Callable[[], Any]) -> dict[int, Any]:
        group = self._group()
        execute = getattr(group, "execute_async", None)
        if execute is None:
            return {}
        try:
            return dict(enumerate(execute(fn)))
        except Exception:  # a closed group: the controller sees why
            return {}

    def poll(self) -> dict[int, Sample]:
        """See :meth:`HangProbe.poll`."""
        import ray

        if not self._pending:
            self._pending = self._send(hang_sampler.sample)
            return {}
        pending = self._pending
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
        done = set(ready)
        out: dict[int, Sample] = {}
        for rank, ref in list(pending.items()):
            if ref not in done:
                continue
            del pending[rank]
            try:
                value = ray.get(ref)
            except Exception:  # a dead worker: its death is an event of its own
                continue
            if isinstance(value, Sample):
                out[rank] = value
        if not pending:  # every rank answered: the next look starts now (one per poll)
            self._pending = self._send(hang_sampler.sample)
        return out

    def stacks(self, timeout_s: float) -> dict[int, str]:
        """See :meth:`HangProbe.stacks`."""
        import ray

        refs = self._send(hang_sampler.all_stacks)
        if not refs:
            return {}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        out: dict[int, str] = {}
        for rank, ref in refs.items():
            if ref not in done:
                out[rank] = "(the worker did not answer in time)\n"
                continue
            try:
                out[rank] = str(ray.get(ref))
            except Exception as exc:
                out[rank] = f"(the worker could not be asked: {type(exc).__name__}: {exc})\n"
        return out

    def reset(self) -> None:
        """See :meth:`HangProbe.reset`."""
        self._pending = {}
