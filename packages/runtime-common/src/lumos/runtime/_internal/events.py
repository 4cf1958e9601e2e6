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


Event = Union[ReportEvent, FinishedEvent, ErrorEvent, WorkerDiedEvent, WorkerHungEvent]  # noqa: UP007 - runtime alias (py3.10)
"""Any event returned by ``WorkerGroup.poll`` / ``WorkerPool.poll``."""
