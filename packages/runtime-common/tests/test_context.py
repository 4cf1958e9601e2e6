from __future__ import annotations

import threading
from typing import Any

import pytest

from lumos.runtime import context


def _ctx(name: str, sink: list[dict[str, Any]] | None = None) -> context.JobContext:
    return context.JobContext(
        kind="tune.trial",
        name=name,
        storage_path=f"memory://exp/{name}",
        storage_filesystem=None,
        report=(sink.append if sink is not None else (lambda m: None)),
        stop_event=threading.Event(),
        stop_error=lambda: RuntimeError(f"{name} stopped"),
    )


def test_current_is_none_outside() -> None:
    assert context.current() is None


def test_running_publishes_and_nests() -> None:
    sink: list[dict[str, Any]] = []
    outer, inner = _ctx("outer", sink), _ctx("inner")
    with context.running(outer) as got:
        assert got is outer
        assert context.current() is outer
        context.current().report({"loss": 1.0})  # type: ignore[union-attr]
        with context.running(inner):
            assert context.current() is inner
        assert context.current() is outer
    assert context.current() is None
    assert sink == [{"loss": 1.0}]
    assert outer.resources_hint == {}


def test_popped_even_when_block_raises() -> None:
    with pytest.raises(ValueError), context.running(_ctx("a")):
        raise ValueError("boom")
    assert context.current() is None


def test_visible_from_other_threads() -> None:
    seen: list[context.JobContext | None] = []
    ctx = _ctx("t")
    with context.running(ctx):
        t = threading.Thread(target=lambda: seen.append(context.current()))
        t.start()
        t.join(10)
    assert seen == [ctx]


def test_stop_signal_and_error() -> None:
    ctx = _ctx("s")
    ctx.stop_event.set()
    assert ctx.stop_event.is_set()
    assert str(ctx.stop_error()) == "s stopped"


def test_rejects_non_context() -> None:
    with pytest.raises(TypeError, match="JobContext"), context.running("nope"):  # type: ignore[arg-type]
        pass


def test_forward_hands_a_committed_checkpoint_to_report_checkpoint() -> None:
    plain: list[dict[str, Any]] = []
    with_checkpoint: list[tuple[dict[str, Any], str]] = []
    ctx = _ctx("t", plain)
    ctx.forward({"i": 0})
    ctx.forward({"i": 1}, "memory://exp/t/train/c1")  # the parent takes no checkpoint
    ctx.report_checkpoint = lambda m, url: with_checkpoint.append((m, url))
    ctx.forward({"i": 2}, "memory://exp/t/train/c2")
    ctx.forward({"i": 3})
    assert plain == [{"i": 0}, {"i": 1}, {"i": 3}]
    assert with_checkpoint == [({"i": 2}, "memory://exp/t/train/c2")]
