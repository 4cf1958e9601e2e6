"""Worker side of ``TorchftConfig``: ``prepare_torchft`` wraps a model and optimizer.

Each rank is one torchft replica group of one process: a ``ProcessGroupGloo`` that
torchft reconfigures at every quorum, a rendezvous ``TCPStore`` of its own and a
``Manager`` that talks to the lighthouse lumos started (``torchft_backend.py``). The
state a replacement receives from a live peer (torchft's checkpoint transport, not
storage) is :func:`peer_state`: the model, the optimizer, the RNG states, the objects
passed as ``state=`` (a loader position) and the rank's report count, so that its
``train.report()`` calls line up with the survivors' (``reports.py``).
"""

from __future__ import annotations

import datetime
import functools
import os
import random
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lumos.runtime import StopRequested
from lumos.train._internal.errors import TrainConfigError
from lumos.train._internal.extras import require_extra
from lumos.train._internal.reporting import CURRENT
from lumos.train._internal.torch.torchft_backend import (
    JOINING_ENV,
    LIGHTHOUSE_ENV,
    MANAGERS,
    TIMEOUT_ENV,
)

if TYPE_CHECKING:
    import torch

    from lumos.train._internal.reporting import TrainSession


class Stateful(Protocol):
    """What ``prepare_torchft(state=...)`` accepts: ``state_dict`` / ``load_state_dict``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def rng_state() -> dict[str, Any]:
    """The RNG states a replacement takes over: torch's (CPU), ``random``'s, numpy's."""
    import torch

    out: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out["numpy"] = numpy.random.get_state()
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Apply :func:`rng_state`'s value (a part missing from it is left alone)."""
    import torch

    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "random" in state:
        random.setstate(state["random"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])


def peer_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: Mapping[str, Stateful],
    report_index: int,
    step: int,
) -> dict[str, Any]:
    """What a live peer sends a replacement (see the module docstring)."""
    return {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "rng": rng_state(),
        "state": {name: obj.state_dict() for name, obj in state.items()},
        "lumos": {"report_index": report_index, "step": step},
    }


def load_peer_state(
    value: Mapping[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: Mapping[str, Stateful],
) -> dict[str, int]:
    """Apply :func:`peer_state`'s value; returns its ``lumos`` part (report index, step)."""
    model.load_state_dict(value["model"])
    optimizer.load_state_dict(value["optim"])
    set_rng_state(value["rng"])
    for name, obj in state.items():
        if name in value["state"]:
            obj.load_state_dict(value["state"][name])
    return dict(value["lumos"])


class FaultTolerantOptimizer:
    """torchft's ``Optimizer`` wrapper, plus whether the last ``step()`` committed.

    ``zero_grad()`` starts the step's quorum (a replacement receives the peers' state
    here); ``step()`` steps only when every live replica's step succeeded (torchft's
    ``should_commit``). Other attributes are the wrapped optimizer's.
    """

    def __init__(self, inner: Any, manager: Any, training: TorchftTraining | None = None) -> None:
        self._inner = inner
        self._manager = manager
        self._training = training
        self._joining = training is not None and bool(os.environ.get(JOINING_ENV))
        self.committed = False
        """Whether the last ``step()`` was committed (``False``: repeat this step)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start the step: the quorum, and the peers' state on a replacement.

        Raises:
            StopRequested: This rank replaces a dead one but no live peer is left to
                take the state from (the others finished): there is nothing to do.
        """
        self._inner.zero_grad(set_to_none)
        if self._joining:
            self._joining = False
            training = self._training
            alone = int(self._manager.num_participants()) <= 1
            if training is not None and training.recovered_at is None and alone:
                raise StopRequested("no live peer holds the state any more: nothing to join")

    @property
    def joining(self) -> bool:
        """Whether this rank joins live peers and has not taken their state yet."""
        return self._joining

    def step(self, closure: None = None) -> None:
        """Step if every live replica's gradients were averaged (``committed``)."""
        before = self._manager.current_step()
        self._inner.step(closure)
        self.committed = self._manager.current_step() > before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class TorchftTraining:
    """What ``prepare_torchft`` returns.

    Attributes:
        model: The model in torchft's ``DistributedDataParallel`` (gradients averaged
            over the replicas of the current quorum).
        optimizer: A :class:`FaultTolerantOptimizer`.
        manager: The rank's torchft ``Manager``.
        recovered_at: The step at which this rank received a live peer's state
            (``None``: it never did, e.g. every rank of a fresh run).
    """

    model: Any
    optimizer: FaultTolerantOptimizer
    manager: Any
    recovered_at: int | None = field(default=None)

    @property
    def step(self) -> int:
        """The number of committed steps (the same on every replica of the quorum)."""
        return int(self.manager.current_step())

    @property
    def committed(self) -> bool:
        """Whether the last ``optimizer.step()`` committed (else that step is repeated)."""
        return self.optimizer.committed

    def participants(self) -> int:
        """How many replicas the current step's quorum has."""
        return int(self.manager.num_participants())

    def resume_from(self, step: int) -> None:
        """Continue counting at ``step`` (after loading a checkpoint saved at that step:
        the fallback restart, where no live peer held the state). Call it on every rank
        before the first ``zero_grad()``.

        On a rank that joins live peers (a replacement, a moved or added rank) it does
        nothing: that rank takes the peers' state, step and report count at its first
        ``zero_grad()`` even when the checkpoint it loaded is at the peers' step (else
        torchft sees nothing to heal, and its reports would not line up with theirs).
        """
        if step < 0:
            raise TrainConfigError(f"resume_from(step={step}): need >= 0")
        if self.optimizer.joining:
            return
        self.manager.load_state_dict({"step": step, "batches_committed": 0})


def prepare_torchft(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    state: Mapping[str, Stateful] | None = None,
    min_replica_size: int = 1,
) -> TorchftTraining:
    """Make this rank a torchft replica: survivors keep stepping, replacements catch up.

    Call it once in the training function of a ``TorchTrainer(torch_config=
    TorchftConfig(...))``, then step with ``optimizer.zero_grad()`` first (the quorum;
    a replacement receives the peers' state there, so read the batch after it),
    ``loss.backward()``, ``optimizer.step()``; loop while ``training.step < n``.
    Report after a committed step (``training.committed``).

    Args:
        model: The model (on CPU; gloo).
        optimizer: Its optimizer.
        state: More objects a replacement takes over from a live peer (a data loader
            position, a scheduler): each needs ``state_dict()`` / ``load_state_dict()``.
        min_replica_size: The fewest replicas a step commits with.

    Returns:
        The wrapped model and optimizer, and the manager.

    Raises:
        TrainConfigError: Not in a training function of a ``TorchftConfig`` run.
        ImportError: torchft is not installed (``lumos-train[torchft]``).
    """
    session = CURRENT.get()
    lighthouse = os.environ.get(LIGHTHOUSE_ENV)
    if session is None or not lighthouse:
        raise TrainConfigError(
            "prepare_torchft() runs inside the training function of "
            "TorchTrainer(..., torch_config=lumos.train.torch.TorchftConfig())"
        )
    if min_replica_size < 1:
        raise TrainConfigError(f"prepare_torchft(min_replica_size={min_replica_size}): need >= 1")
    torchft = require_extra("torchft", "torchft", "lumos.train.torch.prepare_torchft")
    extra = dict(state or {})
    training = TorchftTraining(model, FaultTolerantOptimizer(None, None), None)
    manager = _manager(
        torchft, session, lighthouse, min_replica_size, model, optimizer, extra, training
    )
    training.manager = manager
    training.model = _distributed_data_parallel(torchft, manager, model)
    training.optimizer = FaultTolerantOptimizer(
        torchft.Optimizer(manager, optimizer), manager, training
    )
    MANAGERS[threading.get_ident()] = manager
    if not os.environ.get(JOINING_ENV):
        # The ranks of a launch start their first quorum together once every manager
        # heartbeats: a rank still starting would find the others steps ahead.
        session.runtime.barrier()
    return training


def _manager(
    torchft: Any,
    session: TrainSession,
    lighthouse: str,
    min_replica_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Stateful],
    training: TorchftTraining,
) -> Any:
    """The rank's torchft ``Manager`` over its own store and ``ProcessGroupGloo``."""
    import torch.distributed as dist

    context = session.context
    host = str(context.get_worker_info().node_ip)
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "60")))
    tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]
    store = tcp_store(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    manager: Any = None

    def save() -> dict[str, Any]:
        return peer_state(model, optimizer, extra, session.next_index, manager.current_step())

    def load(value: dict[str, Any]) -> None:
        lumos = load_peer_state(value, model, optimizer, extra)
        session.next_index = lumos["report_index"]  # report as the survivors do
        training.recovered_at = lumos["step"]

    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timeout),
        min_replica_size=min_replica_size,
        load_state_dict=load,
        state_dict=save,
        use_async_quorum=False,  # the peers' state is applied at zero_grad, before forward
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=host,
        store_port=int(store.port),
        lighthouse_addr=lighthouse,
        replica_id=f"{context.get_run_name()}-rank{context.get_world_rank()}",
        hostname=host,
    )
    manager._lumos_store = store  # the store lives as long as the manager
    return manager


def comm_hook(state: Any, bucket: Any) -> Any:
    """torchft's DDP gradient hook, also for a step in which the manager has errored.

    torchft 0.2's own hook returns ``work.get_future()._fut``. Once a collective of the
    step has failed (a peer left mid-step; at the end of a run, the first replica to
    finish shuts its manager down), ``Manager.allreduce`` returns a ``_DummyWork``
    whose future is a plain, completed one, and that hook raised ``AttributeError:
    'Future' object has no attribute '_fut'``, failing the rank. Such a step never
    commits (``should_commit`` says no and the step is repeated), so the bucket it
    returns is never applied: return the plain future.

    A collective that fails in this very call (a peer died mid-allreduce) makes
    ``work.wait()`` return False before torchft chains its future: the chain's future
    never completes, and DDP waited on it for good (the survivors of a lost node
    hung at their next step). The bucket is returned in a completed future instead.
    """
    import torch

    work = state.allreduce(bucket.buffer())
    if work.wait() is False:  # failed and reported to the manager: no commit this step
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done
    future = work.get_future()
    managed = getattr(future, "_fut", None)
    return managed if managed is not None else future


def _distributed_data_parallel(torchft: Any, manager: Any, model: torch.nn.Module) -> Any:
    """torchft's ``DistributedDataParallel`` with :func:`comm_hook` as its gradient hook."""
    return _ddp_class(torchft)(manager, model)


@functools.cache
def _ddp_class(torchft: Any) -> Any:
    """The subclass, made once per process (torchft is imported only when used)."""
    import torch
    import torch.distributed as dist

    # DDP checks a hook's annotations against the real types; this module's are strings
    # (``from __future__ import annotations``)
    comm_hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,  # type: ignore[attr-defined]
        "return": torch.futures.Future[torch.Tensor],
    }

    class DistributedDataParallel(torchft.DistributedDataParallel):  # type: ignore[misc]
        _comm_hook = staticmethod(comm_hook)

    return DistributedDataParallel
