"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): save, async save, load.

Every rank calls :func:`save_sharded_state` with its own local directory and then
``train.report(checkpoint=...)`` with what it returned. DCP writes this rank's shards
(``__<rank>_0.distcp``) into the directory, rank 0 also the global ``.metadata``; lumos
uploads every rank's directory into the same ``<run>/<checkpoint_dir_name>`` and commits
the checkpoint once all of them are there (the ordinary commit rule: an uncommitted
directory is never a checkpoint). :func:`load_sharded_state` reads it back into a model
sharded over any world size: DCP reshards on load (4 ranks -> 2, 2 -> 4).

``async_save=True`` uses ``dcp.async_save``: the call returns once the state is staged
(copied off the live tensors into CPU memory), and a separate checkpoint process per rank
(``AsyncCheckpointerType.PROCESS``, with its own gloo group, so the background save never
interleaves collectives with training's; the default where CUDA is available) or a
thread over a gloo group of its own (the default on CPU-only workers) writes the files. With
``checkpoint_upload_mode=ASYNC`` the report returns at once too, and the worker's upload
thread waits for the files before it uploads them (``pending_saves.py``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from lumos.train._internal import pending_saves
from lumos.train._internal.errors import TrainConfigError, TrainTypeError

EXTRA_FILE = "lumos_extra_state.pt"
"""``extra_state`` of a sharded checkpoint (rank 0 writes it; ``torch.save`` format)."""

ASYNC_TYPES = ("process", "thread")

_process_owner: tuple[Any, int, int] | None = None
"""(default process group, rank, world size) that DCP's checkpoint process was started for."""

_stager: Any = None
"""DCP's ``DefaultStager`` kept for the process: its staging buffers (shared memory,
pinned on GPU hosts) are allocated once and reused by every later async save."""

_last_write: tuple[Any, Any] | None = None
"""(default process group, the future of the latest async save's write): the next one waits
for it before it stages into the same buffers."""

_thread_group: tuple[Any, Any] | None = None
"""(default group, a gloo group of all ranks) for thread-based background saves."""


def _state(model: torch.nn.Module, optimizer: Any, full: bool = False) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if not isinstance(model, torch.nn.Module):
        raise TrainTypeError(f"model={model!r}: expected a torch.nn.Module")
    options = StateDictOptions(full_state_dict=full)  # full: on every rank
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {"model": get_model_state_dict(model, options=options)}
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Without a process group DCP saves as one process, and warns that it does so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _distributed() else 0


def _fresh_checkpoint_process() -> None:
    """End DCP's checkpoint process when it was started for another process group.

    It lives as long as the worker process (a module global of torch's), but a restart
    that keeps this process re-forms the group: a process still joined to the old
    group would wait for ranks that are gone.
    """
    global _process_owner
    import torch.distributed as dist
    from torch.distributed.checkpoint import _async_process_executor as executor

    group = dist.distributed_c10d._get_default_group()
    owner = (group, dist.get_rank(), dist.get_world_size())  # the object: ids get reused
    current = executor._CHECKPOINT_PROCESS
    if current is not None and owner != _process_owner:
        executor._CHECKPOINT_PROCESS = None
        current.__del__()  # asks it to stop, then SIGTERM after 5 s
    _process_owner = owner


def _background_group() -> Any:
    """A gloo group of every rank, only for background saves in a thread of this process.

    A save's collectives in the training's own group would interleave with training's
    (FSDP's all-gathers) and break both. Created by the first async save (every rank
    calls it), again after the process group was re-formed.
    """
    global _thread_group
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    if _thread_group is None or _thread_group[0] is not default:
        _thread_group = (default, dist.new_group(backend="gloo"))
    return _thread_group[1]


def _async_save(state: dict[str, Any], checkpoint_dir: str, kind: str) -> Any:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save

    if not _distributed():  # one process: a copy, saved by a thread of ours (DCP's warns)
        return _single_process_async(_copy(state), checkpoint_dir)
    global _last_write
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    if _last_write is not None and _last_write[0] is default:
        from concurrent.futures import wait

        wait([_last_write[1]])  # its buffers are reused: wait until they were written
    # (a write of an earlier process group may never end: its checkpoint never commits)
    group = None
    if kind == "process":
        _fresh_checkpoint_process()
        kind_enum = AsyncCheckpointerType.PROCESS
    else:
        kind_enum = AsyncCheckpointerType.THREAD
        group = _background_group()
    future = async_save(
        state,
        checkpoint_id=checkpoint_dir,
        async_checkpointer_type=kind_enum,
        process_group=group,
        async_stager=_cached_stager(),
    )
    write = getattr(future, "upload_completion", future)
    _last_write = (default, write)
    return write


def _cached_stager() -> Any:
    global _stager
    if _stager is None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        pinned = torch.cuda.is_available()
        _stager = DefaultStager(StagingOptions(pinned, True, False, False))
    return _stager


def _copy(state: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, state)


def _single_process_async(state: dict[str, Any], checkpoint_dir: str) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    from torch.distributed.checkpoint.state_dict_saver import save

    def run() -> None:
        with _single_process_quiet():
            save(state, checkpoint_id=checkpoint_dir, no_dist=True)

    executor = ThreadPoolExecutor(1, thread_name_prefix="lumos-sharded-save")
    future = executor.submit(run)
    executor.shutdown(wait=False)
    return future


def _waiter(future: Any) -> pending_saves.WaitFn:
    from concurrent.futures import TimeoutError as FutureTimeout

    def wait(timeout_s: float | None) -> bool:
        try:
            future.result(timeout=timeout_s)
        except FutureTimeout:
            return False
        return True

    return wait


def default_async_type() -> str:
    """``async_checkpointer_type=None``: ``"process"`` where CUDA is available (the write
    stays off the training process and its GIL while the GPU trains), ``"thread"`` on
    CPU-only workers, whose cores all train: there DCP's checkpoint process took 1.15x
    the steps' time and 1.57x the memory of training alone in ``bench_fsdp.py``, a thread
    1.05x and 1.12x (2 ranks on 2 cores, a checkpoint every 5 steps)."""
    return "process" if torch.cuda.is_available() else "thread"


def _new_directory(checkpoint_dir: str | os.PathLike[str], async_type: str) -> str:
    """``checkpoint_dir`` as an absolute path, created and empty; the arguments checked."""
    if async_type not in ASYNC_TYPES:
        raise TrainConfigError(
            f"save_sharded_state(async_checkpointer_type={async_type!r}): "
            f"expected one of {ASYNC_TYPES}"
        )
    path = os.path.abspath(os.fspath(checkpoint_dir))
    os.makedirs(path, exist_ok=True)
    if os.listdir(path):
        raise TrainConfigError(
            f"save_sharded_state(checkpoint_dir={path!r}): the directory is not empty; "
            "write every checkpoint into a new one (tempfile.mkdtemp())"
        )
    return path


def save_sharded_state(
    checkpoint_dir: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    extra_state: dict[str, Any] | None = None,
    async_save: bool = False,
    async_checkpointer_type: str | None = None,
) -> Any:
    """Save this rank's shards of ``model`` (and ``optimizer``) into ``checkpoint_dir`` with DCP.

    Call it on every rank, each with a local directory of its own (``tempfile.mkdtemp()``),
    then ``train.report(checkpoint=<the returned checkpoint>)`` on every rank: the
    checkpoint commits once every rank's files are in the run's storage. The state dicts
    come from ``torch.distributed.checkpoint.state_dict.get_state_dict`` (sharded
    ``DTensor`` under FSDP2, plain tensors for DDP or a single process).

    Args:
        checkpoint_dir: a local directory, new or empty, for this rank's files.
        model: the model (prepared with ``parallel_strategy="fsdp"``, ``"ddp"`` or not).
        optimizer: its optimizer, saved with it (resharded on load as well).
        extra_state: small picklable values (step, epoch, RNG seeds), written by rank 0.
        async_save: return once the state is staged in memory and write the files in
            the background (``dcp.async_save``); report it with
            ``checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC`` so that
            ``report()`` does not wait either. Do not change the directory meanwhile.
        async_checkpointer_type: ``"process"`` (a separate checkpoint process per rank
            with its own process group) or ``"thread"`` (a thread of this process, over
            a gloo group of its own). ``None`` (default): ``"process"`` where CUDA is
            available, else ``"thread"`` (:func:`default_async_type`).

    Returns:
        A ``train.Checkpoint`` of ``checkpoint_dir``.

    Raises:
        TrainConfigError: a bad ``async_checkpointer_type`` or a non-empty directory.

    Example:
        >>> d = tempfile.mkdtemp()  # doctest: +SKIP
        >>> ckpt = save_sharded_state(d, model, optimizer, extra_state={"step": step},
        ...                           async_save=True)
        >>> train.report({"loss": loss}, checkpoint=ckpt,
        ...              checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
    """
    from torch.distributed.checkpoint.state_dict_saver import save

    from lumos.storage import Checkpoint

    kind = default_async_type() if async_checkpointer_type is None else async_checkpointer_type
    path = _new_directory(checkpoint_dir, kind)
    if extra_state is not None and _rank() == 0:
        torch.save(dict(extra_state), os.path.join(path, EXTRA_FILE))
    state = _state(model, optimizer)
    if not async_save:
        with _single_process_quiet():
            save(state, checkpoint_id=path, no_dist=not _distributed())
    else:
        future = _async_save(state, path, kind)
        pending_saves.register(path, _waiter(future))
    return Checkpoint.from_directory(path)


def load_sharded_state(
    checkpoint: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load a checkpoint of :func:`save_sharded_state` into ``model`` (and ``optimizer``).

    Call it on every rank after ``prepare_model``. The world size may differ from the
    one that saved it: DCP reads each rank's new shards from whichever files hold them.

    Args:
        checkpoint: a ``train.Checkpoint`` (e.g. ``train.get_checkpoint()``) or a local path.
        model: the model, sharded (or not) as for training.
        optimizer: its optimizer; its state is loaded when given.

    Returns:
        The ``extra_state`` saved with it (``{}`` when none).

    Example:
        >>> ckpt = train.get_checkpoint()  # doctest: +SKIP
        >>> start = load_sharded_state(ckpt, model, optimizer)["step"] + 1 if ckpt else 0
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    from lumos.storage import Checkpoint

    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint.from_directory(os.fspath(checkpoint))
    state = _state(model, optimizer)
    with checkpoint.as_directory() as local:
        with _single_process_quiet():
            load(state, checkpoint_id=local, no_dist=not _distributed())
        extra_path = os.path.join(local, EXTRA_FILE)
        extra = torch.load(extra_path, weights_only=True) if os.path.exists(extra_path) else {}
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    return dict(extra)


def gather_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """A copy of the full (unsharded) model and optimizer state, on every rank.

    A collective: call it on every rank. Meant for tests and exports of small models.
    The tensors are copies: training on does not change them (``get_state_dict`` alone
    returns some live tensors, such as Adam's ``step``).

    Example:
        >>> full = gather_full_state(model, optimizer)  # doctest: +SKIP
        >>> torch.save(full["model"], "model.pt")
    """
    return _copy(_state(model, optimizer, full=True))  # type: ignore[no-any-return]
