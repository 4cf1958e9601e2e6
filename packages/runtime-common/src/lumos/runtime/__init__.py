"""lumos.runtime: the shared Ray runtime of lumos.train and lumos.tune.

Worker groups (a gang of actors in a placement group, with ranks) and worker pools
(independent reusable actors), an event stream with health checks, failure and
scaling policies, the run settings both packages share, and the ambient job
context that lets a nested job find its parent.

Names are loaded on first use (PEP 562): a worker process imports only what it uses.

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

from __future__ import annotations

from typing import TYPE_CHECKING

from lumos.runtime import context as context, worker as worker
from lumos.runtime._version import __version__ as __version__
from lumos.storage import lazy_attributes as lazy_attributes

if TYPE_CHECKING:
    from lumos.runtime import testing as testing
    from lumos.runtime._internal.config import (
        DEFAULT_STORAGE_PATH as DEFAULT_STORAGE_PATH,
        FailureConfig as FailureConfig,
        RunConfig as RunConfig,
    )
    from lumos.runtime._internal.current import (
        CurrentSlot as CurrentSlot,
    )
    from lumos.runtime._internal.errors import (
        LumosRuntimeError as LumosRuntimeError,
        RemoteError as RemoteError,
        RuntimeConfigError as RuntimeConfigError,
        RuntimeUsageError as RuntimeUsageError,
        StopRequested as StopRequested,
        WorkerGroupError as WorkerGroupError,
        WorkerGroupStartError as WorkerGroupStartError,
    )
    from lumos.runtime._internal.events import (
        ErrorEvent as ErrorEvent,
        Event as Event,
        FinishedEvent as FinishedEvent,
        ReportEvent as ReportEvent,
        WorkerDiedEvent as WorkerDiedEvent,
        WorkerHungEvent as WorkerHungEvent,
        WorkerPreemptedEvent as WorkerPreemptedEvent,
    )
    from lumos.runtime._internal.policies import (
        DefaultFailurePolicy as DefaultFailurePolicy,
        ElasticScalingPolicy as ElasticScalingPolicy,
        FailureAction as FailureAction,
        FailureDecision as FailureDecision,
        FailureKind as FailureKind,
        FailurePolicy as FailurePolicy,
        FixedScalingPolicy as FixedScalingPolicy,
        FreeResources as FreeResources,
        GroupState as GroupState,
        NoopDecision as NoopDecision,
        ResizeDecision as ResizeDecision,
        ScalingDecision as ScalingDecision,
        ScalingPolicy as ScalingPolicy,
        WorkerFailure as WorkerFailure,
        describe_failures as describe_failures,
    )
    from lumos.runtime._internal.preemption import (
        PreemptionInfo as PreemptionInfo,
    )
    from lumos.runtime._internal.protocols import (
        GroupFactory as GroupFactory,
        PoolFactory as PoolFactory,
        WorkerGroupProtocol as WorkerGroupProtocol,
        WorkerPoolProtocol as WorkerPoolProtocol,
    )
    from lumos.runtime._internal.ray_init import (
        ensure_ray as ensure_ray,
    )
    from lumos.runtime._internal.resize import (
        ResizeResult as ResizeResult,
    )
    from lumos.runtime._internal.resize_policy import (
        MoveDecision as MoveDecision,
        ResizePolicy as ResizePolicy,
    )
    from lumos.runtime._internal.resources import (
        format_resources as format_resources,
        user_resources as user_resources,
    )
    from lumos.runtime._internal.run_claim import (
        ClaimRules as ClaimRules,
        RunClaim as RunClaim,
        claim_run as claim_run,
        finished_text as finished_text,
        unique_run_name as unique_run_name,
    )
    from lumos.runtime._internal.session import (
        WorkerInfo as WorkerInfo,
        WorkerSession as WorkerSession,
    )
    from lumos.runtime._internal.spec import (
        PlacementStrategy as PlacementStrategy,
        WorkerGroupSpec as WorkerGroupSpec,
        validate_env_vars as validate_env_vars,
        validate_resources as validate_resources,
        validate_runtime_env as validate_runtime_env,
    )
    from lumos.runtime._internal.worker_group import (
        WorkerGroup as WorkerGroup,
    )
    from lumos.runtime._internal.worker_pool import (
        WorkerPool as WorkerPool,
    )

_CONFIG = "lumos.runtime._internal.config"
_ERRORS = "lumos.runtime._internal.errors"
_EVENTS = "lumos.runtime._internal.events"
_POLICIES = "lumos.runtime._internal.policies"
_PROTOCOLS = "lumos.runtime._internal.protocols"
_RUN_CLAIM = "lumos.runtime._internal.run_claim"
_SPEC = "lumos.runtime._internal.spec"

_LAZY: dict[str, str] = {
    "DEFAULT_STORAGE_PATH": _CONFIG,
    "FailureConfig": _CONFIG,
    "RunConfig": _CONFIG,
    "CurrentSlot": "lumos.runtime._internal.current",
    "LumosRuntimeError": _ERRORS,
    "RemoteError": _ERRORS,
    "RuntimeConfigError": _ERRORS,
    "RuntimeUsageError": _ERRORS,
    "StopRequested": _ERRORS,
    "WorkerGroupError": _ERRORS,
    "WorkerGroupStartError": _ERRORS,
    "ErrorEvent": _EVENTS,
    "Event": _EVENTS,
    "FinishedEvent": _EVENTS,
    "ReportEvent": _EVENTS,
    "WorkerDiedEvent": _EVENTS,
    "WorkerHungEvent": _EVENTS,
    "WorkerPreemptedEvent": _EVENTS,
    "DefaultFailurePolicy": _POLICIES,
    "ElasticScalingPolicy": _POLICIES,
    "FailureAction": _POLICIES,
    "FailureDecision": _POLICIES,
    "FailureKind": _POLICIES,
    "FailurePolicy": _POLICIES,
    "FixedScalingPolicy": _POLICIES,
    "FreeResources": _POLICIES,
    "GroupState": _POLICIES,
    "NoopDecision": _POLICIES,
    "ResizeDecision": _POLICIES,
    "ScalingDecision": _POLICIES,
    "ScalingPolicy": _POLICIES,
    "WorkerFailure": _POLICIES,
    "describe_failures": _POLICIES,
    "GroupFactory": _PROTOCOLS,
    "PoolFactory": _PROTOCOLS,
    "WorkerGroupProtocol": _PROTOCOLS,
    "WorkerPoolProtocol": _PROTOCOLS,
    "PreemptionInfo": "lumos.runtime._internal.preemption",
    "ensure_ray": "lumos.runtime._internal.ray_init",
    "ResizeResult": "lumos.runtime._internal.resize",
    "format_resources": "lumos.runtime._internal.resources",
    "user_resources": "lumos.runtime._internal.resources",
    "ClaimRules": _RUN_CLAIM,
    "RunClaim": _RUN_CLAIM,
    "claim_run": _RUN_CLAIM,
    "finished_text": _RUN_CLAIM,
    "unique_run_name": _RUN_CLAIM,
    "MoveDecision": "lumos.runtime._internal.resize_policy",
    "ResizePolicy": "lumos.runtime._internal.resize_policy",
    "WorkerInfo": "lumos.runtime._internal.session",
    "WorkerSession": "lumos.runtime._internal.session",
    "PlacementStrategy": _SPEC,
    "WorkerGroupSpec": _SPEC,
    "validate_env_vars": _SPEC,
    "validate_resources": _SPEC,
    "validate_runtime_env": _SPEC,
    "WorkerGroup": "lumos.runtime._internal.worker_group",
    "WorkerPool": "lumos.runtime._internal.worker_pool",
    "testing": "lumos.runtime.testing",
}

__getattr__, __dir__, __all__ = lazy_attributes(
    "lumos.runtime", _LAZY, globals(), eager=("__version__", "context", "lazy_attributes", "worker")
)
