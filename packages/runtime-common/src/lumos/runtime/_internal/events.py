"""Events a worker group or pool reports to its owner (frozen, picklable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from lumos.runtime._internal.errors import RemoteError


@dataclass(frozen=True)
class ReportEvent:
    """A value the user function emitted with ``WorkerSession.emit``.

    Attributes:
        rank: World rank (group) or worker id (pool) of the emitter.
        seq: 0-based, per launch and per worker; consecutive, so a gap means a loss.
        payload: Whatever was emitted (opaque to the runtime).
    """

    rank: int
    seq: int
    payload: Any


@dataclass(frozen=True)
class FinishedEvent:
    """The user function returned (or ended by raising ``StopRequested``).

    Attributes:
        rank: World rank / worker id.
        result: Return value of the function (``None`` when stopped).
        stopped: True when the function ended by ``StopRequested``.
    """

    rank: int
    result: Any
    stopped: bool


@dataclass(frozen=True)
class ErrorEvent:
    """The user function raised; ``error`` carries type, message and full traceback."""

    rank: int
    error: RemoteError


@dataclass(frozen=True)
class WorkerDiedEvent:
    """The worker's actor process is gone (killed, OOM, node lost)."""

    rank: int
    node_id: str | None
    reason: str


@dataclass(frozen=True)
class WorkerHungEvent:
    """The worker did not answer its health check in time (e.g. a stopped process).

    Attributes:
        waited_s: How long the owner waited for the worker's answer.
    """

    rank: int
    node_id: str | None
    waited_s: float


@dataclass(frozen=True)
class WorkerPreemptedEvent:
    """The worker will be taken away soon: a notice, not a failure (it keeps running).

    Comes once per rank and notice: when Ray marks the worker's node as draining (the
    autoscaler, a spot-termination notice, ``ray drain-node``) or when the worker
    process gets SIGTERM. Every rank's ``WorkerSession.preemption_info()`` returns the
    group's merged notice from then on, so the user function can checkpoint first.

    Attributes:
        node_id: The worker's node.
        deadline_ms: When the worker will be gone (UNIX time, ms); ``None``: not said.
        reason: ``"node draining"`` or ``"SIGTERM"``.
    """

    rank: int
    node_id: str | None
    deadline_ms: int | None
    reason: str


Event = Union[  # noqa: UP007 - runtime alias (py3.10)
    ReportEvent, FinishedEvent, ErrorEvent, WorkerDiedEvent, WorkerHungEvent, WorkerPreemptedEvent
]
"""Any event returned by ``WorkerGroup.poll`` / ``WorkerPool.poll``."""
