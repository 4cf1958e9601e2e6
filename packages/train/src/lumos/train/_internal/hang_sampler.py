"""Worker side of the hang watchdog: where a rank's training thread stands, on demand.

``run_in_session`` registers the training thread (:func:`watch`). The driver's probe
(``controller/hang_probe.py``) calls :func:`sample` in the worker's actor (another
thread, never the training thread) every probe interval; it reads the training
thread's stack with ``sys._current_frames()`` (no attach, no signal, no root) and
returns a small :class:`Sample`: how often the stack moved since the thread started,
how many reports it made, whether its innermost frames are inside a
``torch.distributed`` collective, whether it is somewhere a long wait is expected
(``train.report`` uploading a checkpoint, ``torch.save``, an import, the set-up before
the user's function), and its innermost user frame. When the watchdog fires,
:func:`all_stacks` returns every thread's Python stack as text.

The classification (:func:`classify`) is pure and works on ``(file, line, function)``
triples, so it is unit-tested without threads.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

Frame = tuple[str, int, str]
"""One stack frame: ``(file name, line, function)``."""

# torch.distributed functions that wait for the other ranks
_COLLECTIVES = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
        "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
        "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
        "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv",
        "isend", "irecv", "wait", "batch_isend_irecv", "new_group", "init_process_group",
    }
)  # fmt: skip
# Where a long wait is expected and is not a hang (suffix of the file name -> why)
_EXEMPT_FILES = (
    ("lumos/train/_internal/reporting.py", "in train.report"),
    ("lumos/train/_internal/uploader.py", "uploading a checkpoint"),
    ("lumos/train/_internal/api.py", "in a lumos.train call"),
    ("lumos/tune/_internal/session.py", "in tune.report"),
    ("torch/serialization.py", "in torch.save / torch.load"),
    ("<frozen importlib._bootstrap>", "importing"),
    ("<frozen importlib._bootstrap_external>", "importing"),
)
# Folders whose every call ends by itself (the storage retry policy bounds each one):
# a checkpoint download in ``Checkpoint.as_directory()`` on resume, a storage read
# torchft (TorchftConfig): a replacement joining the quorum and taking its peer's state,
# a collective of the live replicas; TorchftConfig(timeout_s) bounds each.
_EXEMPT_DIRS = (
    ("/lumos/storage/", "in lumos.storage (a checkpoint download or storage call)"),
    ("/torchft/", "in torchft (a quorum, a peer's state or a collective)"),
)

# lumos.runtime's own waits for the other ranks (the launch barrier of prepare_torchft,
# broadcast_from_rank_zero): collectives too
_RUNTIME_SESSION_FILE = "lumos/runtime/_internal/session.py"
_RUNTIME_COLLECTIVES = frozenset({"barrier", "broadcast_from_rank_zero"})

_BACKWARD = "torch/autograd/graph.py"  # _engine_run_backward: loss.backward() in C++
# Local mode under torchrun: train.report waits here for the other ranks, a collective
_EXCHANGE_FILE = "lumos/train/_internal/local_exchange.py"


def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are not the user's (lumos, torch, Ray, torchft, the stdlib)."""
    dirs = [os.path.dirname(os.__file__)]
    names = (
        "lumos.train",
        "lumos.runtime",
        "lumos.storage",
        "lumos.tune",
        "torch",
        "ray",
        "torchft",
    )
    for name in names:
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", None) or ():
            dirs.append(str(path))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


@dataclass(frozen=True)
class Position:
    """Where a stack stands (:func:`classify`).

    Attributes:
        where: ``file:line in function`` of the innermost user frame (else innermost).
        collective: The ``torch.distributed`` function it waits in, or ``None``.
        exempt: Why a long wait here is expected (not a hang), or ``None``.
    """

    where: str
    collective: str | None
    exempt: str | None


def classify(
    frames: Sequence[Frame], library_dirs: Sequence[str] = (), distributed: bool = False
) -> Position:
    """Classify a stack given outermost first (pure). ``distributed``: a process group
    is up, so a thread blocked in autograd's backward waits in DDP's gradient all-reduce
    (its Python stack cannot tell compute from that wait)."""
    exempt = collective = None
    user: Frame | None = None
    exchange = False
    for file, _line, func in reversed(frames):  # innermost first
        norm = file.replace(os.sep, "/")
        if norm.endswith(_EXCHANGE_FILE) and exempt is None:  # waits for the others
            exchange, collective = True, collective or "train.report (the ranks' exchange)"
        if exempt is None and not exchange:
            exempt = next((why for suffix, why in _EXEMPT_FILES if norm.endswith(suffix)), None)
            exempt = exempt or next((why for part, why in _EXEMPT_DIRS if part in norm), None)
        if collective is None and "torch/distributed/" in norm and func in _COLLECTIVES:
            collective = func
        if (
            collective is None
            and norm.endswith(_RUNTIME_SESSION_FILE)
            and func in _RUNTIME_COLLECTIVES
        ):
            collective = f"lumos {func}"
        if collective is None and norm.endswith("torch/nn/parallel/distributed.py"):
            collective = "DistributedDataParallel." + func
        if collective is None and distributed and norm.endswith(_BACKWARD):
            collective = "backward (DDP's gradient all-reduce)"
        if user is None and not file.startswith(tuple(library_dirs)) and not file.startswith("<"):
            user = (file, _line, func)
    if user is None and frames:
        user = frames[-1]
    where = f"{user[0]}:{user[1]} in {user[2]}" if user else "?"
    return Position(where, collective, exempt)


@dataclass(frozen=True)
class Sample:
    """One look at a rank's training thread (what :func:`sample` returns).

    Attributes:
        phase: ``"setup"`` (before the user's function), ``"user"`` (in it), ``"ended"``.
        moves: How often the stack differed from the previous look (a counter).
        reports: The rank's next report index (``train.report()`` calls so far).
        position: Where the stack stands.
    """

    phase: str
    moves: int
    reports: int
    position: Position


class _Watched:
    def __init__(self, thread_id: int, reports: Callable[[], int]) -> None:
        self.thread_id = thread_id
        self.reports = reports
        self.phase = "setup"
        self.signature: tuple[Frame, ...] = ()
        self.moves = 0
        self.lock = threading.Lock()


_watched: _Watched | None = None


def watch(thread_id: int, reports: Callable[[], int]) -> None:
    """Watch ``thread_id`` (the training thread) from now on; ``reports`` counts its reports."""
    global _watched
    _watched = _Watched(thread_id, reports)


def enter_user() -> None:
    """The training thread enters the user's function (set-up is over)."""
    if _watched is not None:
        _watched.phase = "user"


def unwatch(thread_id: int) -> None:
    """The training thread's function ended."""
    global _watched
    if _watched is not None and _watched.thread_id == thread_id:
        _watched = None


def _frames(frame: FrameType | None) -> tuple[Frame, ...]:
    out: list[Frame] = []
    while frame is not None:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    out.reverse()
    return tuple(out)


def sample() -> Sample | None:
    """Look at the watched training thread once (``None``: none is watched)."""
    watched = _watched
    if watched is None:
        return None
    frame = sys._current_frames().get(watched.thread_id)
    if frame is None:
        return Sample("ended", watched.moves, watched.reports(), Position("?", None, None))
    frames = _frames(frame)
    del frame
    with watched.lock:
        if frames != watched.signature:
            watched.signature = frames
            watched.moves += 1
        moves = watched.moves
    position = classify(frames, _library_dirs(), _distributed())
    return Sample(watched.phase, moves, watched.reports(), position)


def _distributed() -> bool:
    """Whether this process has joined a ``torch.distributed`` process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def all_stacks() -> str:
    """Every thread's Python stack in this process, as text (the training thread first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    watched = _watched.thread_id if _watched is not None else None
    frames = sys._current_frames()
    order = sorted(frames, key=lambda tid: tid != watched)
    parts = [f"process {os.getpid()}\n"]
    for tid in order:
        label = " (training thread)" if tid == watched else ""
        parts.append(f"\nThread {names.get(tid, '?')} ({tid}){label}:\n")
        parts.append("".join(traceback.format_stack(frames[tid])))
    return "".join(parts)
