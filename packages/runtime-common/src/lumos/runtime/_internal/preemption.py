"""Preemption notices: ``PreemptionInfo``, the drain state Ray keeps in the GCS, and the
worker-side box a notice lands in (from a SIGTERM of the worker's own process or from
the owner, who watches the GCS for draining nodes).

A notice is not a failure: the worker keeps running until its deadline, so the user
function can checkpoint first. See ``WorkerGroup.poll`` (``WorkerPreemptedEvent``) and
``WorkerSession.preemption_info``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lumos.runtime._internal import messages

logger = logging.getLogger("lumos.runtime")

SIGTERM_DEADLINE_ENV = "LUMOS_SIGTERM_DEADLINE_S"
"""Environment variable: seconds a worker that got SIGTERM assumes it has left (default 30,
Kubernetes' default ``terminationGracePeriodSeconds``)."""
DEFAULT_SIGTERM_DEADLINE_S = 30.0
DRAIN_POLL_INTERVAL_S = 1.0
"""How often ``WorkerGroup.poll`` reads the draining nodes from the GCS (Ray Train: 5 s)."""


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption of some of a group's workers (Ray's ``PreemptionInfo``).

    Attributes:
        deadline_ms: Earliest deadline (UNIX time, milliseconds) across the preempted
            nodes; ``None`` when no deadline was given.
        preempted_node_to_ranks: Each preempted node id -> the world ranks on it that are
            affected.

    Example:
        >>> info = PreemptionInfo(1_700_000_000_000, {"node-b": [2, 3]})
        >>> info.preempted_ranks
        [2, 3]
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """Preempted node ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """Every affected rank, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})

    def seconds_left(self, now_s: float | None = None) -> float | None:
        """Seconds until the deadline (negative when passed); ``None`` without a deadline."""
        if self.deadline_ms is None:
            return None
        now = time.time() if now_s is None else now_s
        return self.deadline_ms / 1000.0 - now


def merge_preemption_info(
    old: PreemptionInfo | None, new: PreemptionInfo | None
) -> PreemptionInfo | None:
    """Union of two notices: ranks per node joined, the earlier deadline kept."""
    if old is None or new is None:
        return new if old is None else old
    ranks: dict[str, set[int]] = {}
    for info in (old, new):
        for node, rs in info.preempted_node_to_ranks.items():
            ranks.setdefault(node, set()).update(rs)
    deadlines = [d for d in (old.deadline_ms, new.deadline_ms) if d is not None]
    return PreemptionInfo(
        min(deadlines, default=None), {n: sorted(rs) for n, rs in sorted(ranks.items())}
    )


def draining_nodes() -> dict[str, int]:
    """Nodes Ray marks as draining (autoscaler, spot notice, ``ray drain-node``).

    Returns:
        ``{node_id_hex: deadline_ms}`` (``0``: no deadline); ``{}`` when Ray cannot say.
    """
    try:
        import ray

        state: Any = ray._private.state.state  # the GCS accessor ray.train V2 reads too
        return dict(state.get_draining_nodes() or {})
    except Exception:
        logger.debug("reading the draining nodes failed", exc_info=True)
        return {}


def sigterm_deadline_s() -> float:
    """Seconds a worker that got SIGTERM assumes it has (``LUMOS_SIGTERM_DEADLINE_S``)."""
    raw = os.environ.get(SIGTERM_DEADLINE_ENV)
    try:
        value = float(raw) if raw else DEFAULT_SIGTERM_DEADLINE_S
    except ValueError:
        value = DEFAULT_SIGTERM_DEADLINE_S
    return value if value > 0 else DEFAULT_SIGTERM_DEADLINE_S


class PreemptionBox:
    """Worker side: the notices this worker process knows of (thread-safe).

    ``own`` is set by a SIGTERM of this process and stays; ``group`` is what the owner
    sent last (all of the group's preempted ranks) and is replaced by each new message.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: PreemptionInfo | None = None
        self._group: PreemptionInfo | None = None

    def get(self) -> PreemptionInfo | None:
        """The merged notice, or ``None``."""
        with self._lock:
            return merge_preemption_info(self._own, self._group)

    def set_own(self, info: PreemptionInfo) -> None:
        with self._lock:
            self._own = merge_preemption_info(self._own, info)

    def set_group(self, info: PreemptionInfo | None) -> None:
        with self._lock:
            self._group = info


def install_sigterm_notice(on_notice: Callable[[int], bool]) -> bool:
    """Make SIGTERM a preemption notice for this process instead of an exit.

    Must run in the main thread (a Ray actor's ``__init__`` does). The handler calls
    ``on_notice(deadline_ms)``: when that returns True the notice was recorded and the
    process keeps running (until it is killed or its owner removes it); when it returns
    False (notices not wanted, e.g. a pool worker) the previous handler runs, so SIGTERM
    ends the process as before.

    Returns:
        False when the handler could not be installed (not the main thread).
    """
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        return False

    def handler(signum: int, frame: Any) -> None:
        deadline_ms = int((time.time() + sigterm_deadline_s()) * 1000)
        try:
            if on_notice(deadline_ms):
                return
        except Exception:
            logger.warning(messages.SIGTERM_NOTICE_FAILED, exc_info=True)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return False
    return True
