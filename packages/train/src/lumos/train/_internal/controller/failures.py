"""The ``WorkerFailure`` each kind of worker ending means (for the failure policy)."""

from __future__ import annotations

from lumos.runtime import (
    ErrorEvent,
    Event,
    FailureKind,
    RemoteError,
    WorkerDiedEvent,
    WorkerFailure,
    WorkerHungEvent,
)


def upload_failure(rank: int, error: BaseException, node: str | None) -> WorkerFailure:
    """A rank's background checkpoint upload failed: that rank fails like a user error."""
    remote = (
        error if isinstance(error, RemoteError) else RemoteError.from_exception(error, rank=rank)
    )
    text = remote.message.strip().splitlines()
    return WorkerFailure(
        rank=rank,
        kind=FailureKind.USER_ERROR,
        node_id=node,
        error=remote,
        message=f"checkpoint upload failed: {text[0] if text else type(error).__name__}",
    )


def failure_of(event: Event, node: str | None) -> WorkerFailure | None:
    """The failure an error, death or hang event means (``None`` for other events)."""
    if isinstance(event, ErrorEvent):
        first = event.error.message.strip().splitlines()
        return WorkerFailure(
            rank=event.rank,
            kind=FailureKind.USER_ERROR,
            node_id=node,
            error=event.error,
            message=f"{event.error.exc_type.rsplit('.', 1)[-1]}: {first[0] if first else ''}",
        )
    if isinstance(event, WorkerDiedEvent):
        return WorkerFailure(
            rank=event.rank,
            kind=FailureKind.ACTOR_DIED,
            node_id=event.node_id or node,
            message=f"worker process died ({event.reason})",
        )
    if isinstance(event, WorkerHungEvent):
        return WorkerFailure(
            rank=event.rank,
            kind=FailureKind.HUNG,
            node_id=event.node_id or node,
            message=f"worker did not answer for {event.waited_s:.0f} s (hung)",
        )
    return None  # unknown event kinds are ignored
