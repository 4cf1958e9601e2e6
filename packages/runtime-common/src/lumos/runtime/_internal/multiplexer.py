"""Owner side: one outstanding long-poll call per worker, ``ray.wait`` over all of them.

Shared by WorkerGroup and WorkerPool. A reply is a pickled batch of raw events; a
pending call that errors because the actor died becomes ``WorkerDiedEvent`` at once;
a call that does not return within ``max_wait_s + health_check_timeout_s`` becomes
``WorkerHungEvent``.

With ``park_idle_s`` (WorkerPool), a worker whose function ended (FINISHED or ERROR)
is *parked*: no poll call is issued to it for up to ``park_idle_s``, so that the next
launch can carry its own poll (``adopt``) and a short run costs one round trip. After
``park_idle_s`` an idle worker is polled again, so its death is still noticed.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from lumos.runtime._internal.errors import RemoteError, RuntimeConfigError
from lumos.runtime._internal.events import (
    ErrorEvent,
    Event,
    FinishedEvent,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
    WorkerPreemptedEvent,
)
from lumos.runtime._internal.session import (
    COLLECTIVE,
    ERROR,
    FINISHED,
    PREEMPT,
    REPORT,
    RawEvent,
)

logger = logging.getLogger("lumos.runtime")

CollectiveHandler = Callable[[int, tuple[str, int], Any], None]


def long_poll_wait_s(health_check_timeout_s: float) -> float:
    """How long one long-poll call may wait in the worker before returning empty."""
    return max(0.2, min(2.0, health_check_timeout_s / 2))


@dataclass
class _Channel:
    key: int
    actor: Any
    node_id: str | None
    pending: Any = None  # ObjectRef of the outstanding poll call
    issued_at: float = 0.0
    failed: bool = False
    hung: bool = False
    parked_at: float | None = None  # idle, not polled since then (see ``park_idle_s``)


def describe_actor_error(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}"[:2000]


def decode(
    key: int,
    raw: RawEvent,
    on_collective: CollectiveHandler | None,
    node_id: str | None = None,
) -> Event | None:
    """Turn one raw worker event into a public Event (collectives go to the handler)."""
    kind, seq, data = raw
    if kind == REPORT:
        return ReportEvent(key, seq, data)
    if kind == FINISHED:
        result, stopped = data
        return FinishedEvent(key, result, bool(stopped))
    if kind == ERROR:
        err: RemoteError = data
        return ErrorEvent(key, err if err.rank == key else err.with_rank(key))
    if kind == COLLECTIVE:
        ckey, value = data
        if on_collective is not None:
            on_collective(key, ckey, value)
        return None
    if kind == PREEMPT:
        deadline_ms, reason = data
        return WorkerPreemptedEvent(key, node_id, deadline_ms, str(reason))
    raise RuntimeConfigError(f"unknown raw event kind {kind!r}")


class EventMultiplexer:
    """Waits on all workers' long-poll calls at once."""

    def __init__(
        self,
        health_check_timeout_s: float,
        on_collective: CollectiveHandler | None = None,
        park_idle_s: float = 0.0,
    ):
        self.health_check_timeout_s = health_check_timeout_s
        self.max_wait_s = long_poll_wait_s(health_check_timeout_s)
        self.on_collective = on_collective
        self.park_idle_s = park_idle_s
        self._channels: dict[int, _Channel] = {}

    def add(self, key: int, actor: Any, node_id: str | None) -> None:
        ch = _Channel(key, actor, node_id)
        actor.set_poll_wait.remote(self.max_wait_s)  # then poll() needs no argument
        if self.park_idle_s > 0:
            ch.parked_at = time.monotonic()  # a new worker runs nothing yet
        self._channels[key] = ch

    def parked(self, key: int) -> bool:
        """True when the worker is idle and no poll call is outstanding to it."""
        ch = self._channels.get(key)
        return ch is not None and not ch.failed and ch.pending is None and ch.parked_at is not None

    def unpark(self, key: int) -> None:
        """Poll the worker again from the next ``poll`` on (it was given work)."""
        ch = self._channels.get(key)
        if ch is not None:
            ch.parked_at = None

    def adopt(self, key: int, ref: Any) -> None:
        """Use ``ref`` (a call that returns an event batch, like ``poll``) as the
        worker's outstanding poll; only for a ``parked`` worker."""
        ch = self._channels[key]
        if not self.parked(key):
            raise RuntimeError(f"worker {key} has a poll call outstanding; it cannot adopt one")
        ch.pending = ref
        ch.issued_at = time.monotonic()
        ch.parked_at = None

    def remove(self, key: int) -> None:
        self._channels.pop(key, None)

    def rekey(self, mapping: dict[int, int]) -> None:
        """Renumber the channels (a group resize): ``mapping`` is old key -> new key;
        channels not in it are dropped. An outstanding poll call stays with its worker."""
        channels: dict[int, _Channel] = {}
        for old, ch in self._channels.items():
            if old in mapping:
                ch.key = mapping[old]
                channels[ch.key] = ch
        self._channels = channels

    def clear(self) -> None:
        self._channels.clear()

    def is_failed(self, key: int) -> bool:
        ch = self._channels.get(key)
        return ch is None or ch.failed

    def is_hung(self, key: int) -> bool:
        ch = self._channels.get(key)
        return ch is not None and ch.hung

    def _issue(self, ch: _Channel, now: float) -> None:
        ch.pending = ch.actor.poll.remote()  # no argument: see WorkerActor.poll
        ch.issued_at = now

    def poll(self, timeout_s: float | None, wake: list[Any] | None = None) -> list[Event]:
        """Block until at least one event or ``timeout_s`` (None: until an event).

        Returns ``[]`` early when one of the ``wake`` refs becomes ready.
        """
        wake = list(wake or [])
        start = time.monotonic()
        deadline = None if timeout_s is None else start + max(0.0, timeout_s)
        while True:
            now = time.monotonic()
            live = [c for c in self._channels.values() if not c.failed]
            unpark_at = self._issue_due(live, now)
            polled = [c for c in live if c.pending is not None]
            if not live and not wake:
                return []
            by_ref = {c.pending: c for c in polled}
            hang_at = min(
                (c.issued_at + self.max_wait_s + self.health_check_timeout_s for c in polled),
                default=float("inf"),
            )
            wake_at = min(hang_at, unpark_at)
            until = wake_at if deadline is None else min(wake_at, deadline)
            wait_s = None if until == float("inf") else max(0.0, until - now)
            refs = list(by_ref) + wake
            if not refs:
                # Only parked workers: sleep until one unparks (or the deadline).
                time.sleep(wait_s or 0.0)
                if deadline is not None and time.monotonic() >= deadline:
                    return []
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s, fetch_local=True)
            if ready and len(refs) > 1:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            events: list[Event] = []
            woke = False
            for ref in ready:
                owner = by_ref.get(ref)
                if owner is None:
                    woke = True
                    continue
                events.extend(self._collect(owner, ref))
            events.extend(self._mark_hung(polled, ready, time.monotonic()))
            if events or woke:
                return events
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _issue_due(self, live: list[_Channel], now: float) -> float:
        """Issue a poll call to every live worker without one (parked ones excepted).

        Returns:
            When the first parked worker is to be polled again (``inf``: none parked).
        """
        unpark_at = float("inf")
        for ch in live:
            if ch.pending is None:
                if ch.parked_at is not None and now < ch.parked_at + self.park_idle_s:
                    unpark_at = min(unpark_at, ch.parked_at + self.park_idle_s)
                    continue
                ch.parked_at = None
                self._issue(ch, now)
        return unpark_at

    def _mark_hung(self, polled: list[_Channel], ready: list[Any], now: float) -> list[Event]:
        """WorkerHungEvent for each overdue poll call; that worker counts as failed."""
        events: list[Event] = []
        for ch in polled:
            if ch.failed or ch.pending is None or ch.pending in ready:
                continue
            waited = now - ch.issued_at
            if waited > self.max_wait_s + self.health_check_timeout_s:
                ch.failed = True
                ch.hung = True
                ch.pending = None
                events.append(WorkerHungEvent(ch.key, ch.node_id, waited))
        return events

    def _collect(self, ch: _Channel, ref: Any) -> list[Event]:
        ch.pending = None
        try:
            blob = ray.get(ref, timeout=30)
        except RayActorError as exc:
            ch.failed = True
            return [WorkerDiedEvent(ch.key, ch.node_id, describe_actor_error(exc))]
        except (RayError, GetTimeoutError) as exc:
            # The poll call itself failed (not the user function): treat the worker as lost.
            ch.failed = True
            return [WorkerDiedEvent(ch.key, ch.node_id, describe_actor_error(exc))]
        try:
            raws: list[RawEvent] = pickle.loads(blob)
        except Exception as exc:
            err = RemoteError.from_exception(
                RuntimeError(
                    f"events from worker {ch.key} could not be unpickled in the owner process "
                    f"({type(exc).__name__}: {exc}); is every class you emit importable here?"
                ),
                rank=ch.key,
            )
            return [ErrorEvent(ch.key, err)]
        out: list[Event] = []
        for raw in raws:
            ev = decode(ch.key, raw, self.on_collective, ch.node_id)
            if ev is not None:
                out.append(ev)
            if self.park_idle_s > 0 and raw[0] in (FINISHED, ERROR):
                ch.parked_at = time.monotonic()
        return out
