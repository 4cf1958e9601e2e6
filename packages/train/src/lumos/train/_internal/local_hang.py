"""The hang watchdog in local mode and under torchrun (``local.py``).

The same :class:`~lumos.train._internal.controller.components.hang_watchdog.HangWatchdog`
and ``HangJudge`` as on Ray, over other probes, driven by a thread of its own (in local
mode the driver runs in the training thread, which is the one that may be stuck):

* **Alone** (``num_workers=0``): :class:`InProcessProbe` samples the training thread of
  this process (``hang_sampler.sample``) from the watchdog's thread.
* **torchrun**: every rank runs a :class:`Publisher` thread that puts its sample into
  torchrun's TCP store (``MASTER_ADDR:MASTER_PORT``, under a key prefix of the run and
  the restart) every probe interval and answers stack requests; rank 0's
  :class:`StoreProbe` reads them. No collective: a stuck rank still publishes.

When it fires, the stacks, ``hang.json`` and the culprit line are written as on Ray.
A stuck training thread cannot be stopped from inside its process, and local mode
does not retry in the process: rank 0 records the failed attempt (the run errors, its
``TrainingFailedError`` holding the ``RankStuckError``), says so, and its process exits
with :data:`HANG_EXIT_CODE`. ``torchrun --max-restarts`` then restarts every rank (its
agent stops the others), and they resume from the latest committed checkpoint, as a
rerun of ``fit()`` does.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lumos.train._internal import hang_sampler
from lumos.train._internal.controller import messages
from lumos.train._internal.controller.components.hang_watchdog import (
    HangWatchdog,
    probe_interval_s,
)
from lumos.train._internal.controller.seam import Attempt, Component, RanksStuck
from lumos.train._internal.hang_sampler import Sample

if TYPE_CHECKING:
    from lumos.train._internal.controller.core import RunCore
    from lumos.train._internal.controller.spec import RunSpec
    from lumos.train._internal.local_exchange import Exchange

HANG_EXIT_CODE = 75
"""The exit status of a local or torchrun process whose run the watchdog failed
(``EX_TEMPFAIL``: a restart may succeed)."""


class InProcessProbe:
    """A ``HangProbe`` over this process's training thread (local mode, one rank)."""

    def poll(self) -> dict[int, Sample]:
        """This rank's sample (see ``HangProbe.poll``)."""
        sample = hang_sampler.sample()
        return {} if sample is None else {0: sample}

    def stacks(self, timeout_s: float) -> dict[int, str]:
        """This process's stacks."""
        return {0: hang_sampler.all_stacks()}

    def reset(self) -> None:
        """Nothing is in flight."""

    def node_of(self, rank: int) -> str | None:
        """This host."""
        return socket.gethostname()


def _key(kind: str, rank: int, n: int = 0) -> str:
    return f"{kind}/{rank}/{n}"


class StoreProbe:
    """A ``HangProbe`` over the samples the ranks' :class:`Publisher` s put in a store.

    Args:
        store: A ``torch.distributed.Store`` every rank reaches (keys already prefixed).
        world_size: The number of ranks.
        poll_s: How often :meth:`stacks` looks for the answers.
    """

    def __init__(self, store: Any, world_size: int, poll_s: float = 0.05) -> None:
        self._store = store
        self._world = world_size
        self._poll_s = poll_s
        self._hosts: dict[int, str] = {}
        self._seen: dict[int, int] = {}  # the last sample number read, per rank
        self._asked = 0

    def poll(self) -> dict[int, Sample]:
        """Each rank's sample published since the last poll (see ``HangProbe.poll``)."""
        out: dict[int, Sample] = {}
        for rank in range(self._world):
            key = _key("sample", rank)
            if not self._store.check([key]):
                continue
            number, host, sample = pickle.loads(self._store.get(key))
            self._hosts[rank] = host
            if sample is not None and number != self._seen.get(rank):
                self._seen[rank] = number
                out[rank] = sample
        return out

    def stacks(self, timeout_s: float) -> dict[int, str]:
        """Ask every rank's publisher for its stacks; wait up to ``timeout_s``."""
        self._asked += 1
        self._store.set("ask", str(self._asked))
        deadline = time.monotonic() + timeout_s
        out: dict[int, str] = {}
        while len(out) < self._world:
            for rank in range(self._world):
                key = _key("stacks", rank, self._asked)
                if rank not in out and self._store.check([key]):
                    out[rank] = self._store.get(key).decode()
            if len(out) < self._world and time.monotonic() > deadline:
                break
            time.sleep(self._poll_s)
        for rank in range(self._world):
            out.setdefault(rank, "(the rank did not answer in time)\n")
        return out

    def reset(self) -> None:
        """Nothing is in flight between polls."""

    def node_of(self, rank: int) -> str | None:
        """The host a rank published from."""
        return self._hosts.get(rank)


class Publisher:
    """Every rank under torchrun: its sample into the store every ``interval_s``, and its
    stacks when rank 0 asks (a daemon thread; :meth:`stop` ends it).

    Args:
        store: The shared store (keys already prefixed).
        rank: This rank.
        interval_s: How often to publish.
    """

    def __init__(self, store: Any, rank: int, interval_s: float) -> None:
        self._store = store
        self._rank = rank
        self._interval_s = interval_s
        self._host = socket.gethostname()
        self._answered = 0
        self._published = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lumos-hang-publisher", daemon=True)

    def start(self) -> Publisher:
        """Start publishing."""
        self._thread.start()
        return self

    def publish_once(self) -> None:
        """Publish the current sample and answer a pending stack request."""
        sample = hang_sampler.sample()
        self._published += 1
        message = pickle.dumps((self._published, self._host, sample))
        self._store.set(_key("sample", self._rank), message)
        if self._store.check(["ask"]):
            asked = int(self._store.get("ask"))
            if asked > self._answered:
                self._answered = asked
                text = hang_sampler.all_stacks().encode()
                self._store.set(_key("stacks", self._rank, asked), text)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.publish_once()
            except Exception:  # the store went away: the run is ending
                return

    def stop(self) -> None:
        """Stop publishing (waits for the thread)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


class LocalHangComponent(Component):
    """Rank 0's watchdog: the run core's hooks reach the ``HangWatchdog``; its own thread
    samples every ``interval_s`` and, when it fires, fails the run and exits.

    Args:
        dog: The watchdog (over an :class:`InProcessProbe` or a :class:`StoreProbe`).
        exit_process: Ends the process (tests pass their own).
    """

    def __init__(self, dog: HangWatchdog, exit_process: Callable[[int], None] = os._exit) -> None:
        self.dog = dog
        self._exit = exit_process
        self._lock = threading.Lock()
        self._core: RunCore | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lumos-hang-watchdog", daemon=True)

    def bind(self, core: RunCore) -> None:
        """The run core whose run fails when the watchdog fires; starts the thread."""
        self._core = core
        self._thread.start()

    def attempt_started(self, attempt: Attempt) -> None:
        with self._lock:
            self.dog.attempt_started(attempt)

    def run_ending(self, finished: bool) -> None:
        self._stop.set()
        with self._lock:
            self.dog.run_ending(finished)

    def check_once(self) -> RanksStuck | None:
        """One look at the ranks (what the thread does every interval)."""
        with self._lock:
            verdict = self.dog.idle(0.0)
        return verdict if isinstance(verdict, RanksStuck) else None

    def _run(self) -> None:
        while not self._stop.wait(self.dog.interval_s):
            verdict = self.check_once()
            if verdict is not None and not self._stop.is_set():
                self.fail(verdict)
                return

    def fail(self, verdict: RanksStuck) -> None:
        """Record the failed attempt (the run errors), say so, and exit the process."""
        core = self._core
        assert core is not None, "bind() the run core first"
        errors: dict[int, BaseException] = {
            f.rank: f.error for f in verdict.failures if f.error is not None
        }
        text = "; ".join(f"rank {f.rank}: {f.message}" for f in verdict.failures)
        error = core.failed_error(text, errors, len(verdict.failures))
        with contextlib.suppress(Exception):
            core.close_failed(error, aborted=False, clean=False)
        core.console.warning(messages.hang_exit_line(HANG_EXIT_CODE))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._exit(HANG_EXIT_CODE)


def _store_prefix(run: RunSpec) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return f"lumos/hang/{run.storage.name}/{run_id}/{restart}/"


def _torchrun_store(run: RunSpec) -> Any:
    """A client of torchrun's TCP store, under this run's and restart's key prefix."""
    import torch.distributed as dist

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=60)
    client = dist.TCPStore(host, port, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
    return dist.PrefixStore(_store_prefix(run), client)  # type: ignore[attr-defined]


@contextlib.contextmanager
def watching(
    run: RunSpec, exchange: Exchange, timeout_s: float | None
) -> Iterator[tuple[Component, ...]]:
    """The local run's watchdog for the ``with`` block: rank 0's component (to register
    with ``RunCore(extra=...)`` and :meth:`LocalHangComponent.bind`), the publishers."""
    if timeout_s is None:
        yield ()
        return
    interval = probe_interval_s(timeout_s)
    store = _torchrun_store(run) if exchange.world_size > 1 else None
    publisher = Publisher(store, exchange.rank, interval).start() if store is not None else None
    component: LocalHangComponent | None = None
    if exchange.rank == 0:
        probe: InProcessProbe | StoreProbe = (
            InProcessProbe() if store is None else StoreProbe(store, exchange.world_size)
        )
        dog = HangWatchdog(run.storage, run.console, probe, timeout_s, probe.node_of)
        component = LocalHangComponent(dog)
    try:
        yield () if component is None else (component,)
    finally:
        if component is not None:
            component.run_ending(False)
        if publisher is not None:
            publisher.stop()
