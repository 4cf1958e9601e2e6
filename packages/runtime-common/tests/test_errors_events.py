from __future__ import annotations

import pickle
import threading

import pytest

from lumos.runtime import (
    ErrorEvent,
    Event,
    FinishedEvent,
    LumosRuntimeError,
    RemoteError,
    ReportEvent,
    StopRequested,
    WorkerDiedEvent,
    WorkerGroupError,
    WorkerGroupStartError,
    WorkerHungEvent,
)


class _Unpicklable(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


def _raise_nested() -> None:
    def inner() -> None:
        raise KeyError("missing-key")

    try:
        inner()
    except KeyError as exc:
        raise RuntimeError("outer failure") from exc


def _capture(fn: object) -> RemoteError:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:
        return RemoteError.from_exception(exc, rank=3)
    raise AssertionError("did not raise")


def test_remote_error_captures_type_message_and_full_traceback() -> None:
    err = _capture(_raise_nested)
    assert err.exc_type == "builtins.RuntimeError"
    assert err.message == "outer failure"
    assert "inner" in err.traceback
    assert "_raise_nested" in err.traceback
    assert "missing-key" in err.traceback  # chained cause kept
    assert isinstance(err.cause, RuntimeError)
    text = str(err)
    assert "rank 3" in text
    assert "Remote traceback" in text
    assert "_raise_nested" in text


def test_remote_error_pickles_with_cause() -> None:
    err = _capture(_raise_nested)
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, RemoteError)
    assert isinstance(back, LumosRuntimeError)
    assert (back.exc_type, back.message, back.traceback, back.rank) == (
        err.exc_type,
        err.message,
        err.traceback,
        3,
    )
    assert isinstance(back.cause, RuntimeError)
    assert str(back.cause) == "outer failure"


def test_remote_error_pickles_without_unpicklable_cause() -> None:
    def boom() -> None:
        raise _Unpicklable("holds a lock")

    err = _capture(boom)
    assert err.cause is None
    back = pickle.loads(pickle.dumps(err))
    assert back.message == "holds a lock"
    assert back.cause is None
    assert "boom" in back.traceback


def test_worker_group_error_holds_every_rank_and_pickles() -> None:
    errors = {1: _capture(_raise_nested).with_rank(1), 0: _capture(_raise_nested).with_rank(0)}
    exc = WorkerGroupError(errors)
    assert list(exc.errors) == [0, 1]
    text = str(exc)
    assert "--- rank 0 ---" in text
    assert "--- rank 1 ---" in text
    back = pickle.loads(pickle.dumps(exc))
    assert list(back.errors) == [0, 1]
    assert back.errors[1].rank == 1


@pytest.mark.parametrize(
    "exc", [WorkerGroupStartError("no resources"), StopRequested("stop"), LumosRuntimeError("x")]
)
def test_other_exceptions_pickle(exc: BaseException) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)


def test_events_are_frozen_and_pickle() -> None:
    err = _capture(_raise_nested)
    events: list[Event] = [
        ReportEvent(0, 5, {"loss": 1.0}),
        FinishedEvent(1, {"ok": True}, False),
        ErrorEvent(1, err),
        WorkerDiedEvent(0, "node", "SIGKILL"),
        WorkerHungEvent(1, None, 12.5),
    ]
    for ev in events:
        back = pickle.loads(pickle.dumps(ev))
        assert type(back) is type(ev)
        assert back.rank == ev.rank
    with pytest.raises(AttributeError):
        events[0].rank = 3  # type: ignore[misc]  # frozen
