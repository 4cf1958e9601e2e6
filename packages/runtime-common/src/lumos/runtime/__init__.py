"""lumos.runtime: the shared Ray runtime of lumos.train and lumos.tune.

Worker groups (a gang of actors in a placement group, with ranks) and worker pools
(independent reusable actors), an event stream with health checks, failure and
scaling policies, and the ambient job context that lets a nested job find its parent.

Example:
    >>> from lumos.runtime import WorkerGroup, WorkerGroupSpec, FinishedEvent, worker
    >>> def fn(x):
    ...     worker.get_session().emit({"x": x})
    ...     return x * 2
    >>> with WorkerGroup.start(WorkerGroupSpec(num_workers=2)) as group:
    ...     group.launch(fn, args=(21,))
    ...     events = []
    ...     while sum(isinstance(e, FinishedEvent) for e in events) < 2:
    ...         events += group.poll(timeout_s=10)
"""

from typing import TYPE_CHECKING, Any

from lumos.runtime import context, worker
from lumos.runtime._internal.errors import (
    LumosRuntimeError,
    RemoteError,
    StopRequested,
    WorkerGroupError,
    WorkerGroupStartError,
)
from lumos.runtime._internal.events import (
    ErrorEvent,
    Event,
    FinishedEvent,
    ReportEvent,
    WorkerDiedEvent,
    WorkerHungEvent,
)
from lumos.runtime._internal.policies import (
    ElasticScalingPolicy,
    FailureAction,
    FailureDecision,
    FailureKind,
    FailurePolicy,
    FixedScalingPolicy,
    NoopDecision,
    ResizeDecision,
    ScalingDecision,
    ScalingPolicy,
    WorkerFailure,
)
from lumos.runtime._internal.session import WorkerInfo, WorkerSession
from lumos.runtime._internal.worker_group import WorkerGroup, WorkerGroupSpec
from lumos.runtime._internal.worker_pool import WorkerPool
from lumos.runtime._version import __version__

__all__ = [
    "ElasticScalingPolicy",
    "ErrorEvent",
    "Event",
    "FailureAction",
    "FailureDecision",
    "FailureKind",
    "FailurePolicy",
    "FinishedEvent",
    "FixedScalingPolicy",
    "LumosRuntimeError",
    "NoopDecision",
    "RemoteError",
    "ReportEvent",
    "ResizeDecision",
    "ScalingDecision",
    "ScalingPolicy",
    "StopRequested",
    "WorkerDiedEvent",
    "WorkerFailure",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupSpec",
    "WorkerGroupStartError",
    "WorkerHungEvent",
    "WorkerInfo",
    "WorkerPool",
    "WorkerSession",
    "__version__",
    "context",
    "testing",
    "worker",
]

if TYPE_CHECKING:
    from lumos.runtime import testing


def __getattr__(name: str) -> Any:
    # ``testing`` is imported on first use: worker processes never need it.
    if name == "testing":
        import importlib

        return importlib.import_module("lumos.runtime.testing")
    raise AttributeError(f"module 'lumos.runtime' has no attribute {name!r}")
