"""bench_goodput's job with per-step fault tolerance (``TorchftConfig``): loop and figures,
and the pieces both of its loops share (checkpoint save and load, stalls, the history).

The same job as ``bench_goodput.loop`` (a tiny ``nn.Linear``, 2 ranks, steps sleep-padded
to ``--step-s``, a checkpoint every ``--every`` committed steps, ASYNC), each rank one
torchft replica (``prepare_torchft``): when a rank dies or hangs the other keeps stepping
and the replacement takes its peer's state at its first ``zero_grad()``. Its batch is
seeded by ``(step, rank)`` as in the DDP loop.

What counts differs from checkpoint-restart: a committed step is never computed again,
so the steps that count are the committed steps (``ft.step`` at the end), and a fault
costs the uncommitted steps (repeated) plus the steps the whole job did not make while
it waited. A step that only one of the two replicas made saw half the samples: the
figures give both the step goodput (committed steps x step time / wall) and the sample
goodput (each step weighted by its replicas / ranks).

The driver stops the job by writing a step into ``cfg["until"]``: the replicas agree on
``ft.step``, so all of them stop after the same committed step.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

WORKERS = 2


def _stop_step(cfg: dict[str, Any]) -> int | None:
    try:
        with open(cfg["until"]) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def maybe_stall(cfg: dict[str, Any], where: str, mark: Any) -> None:
    """The stuck fault: sleep for good here when the driver asked this process to."""
    path = os.path.join(cfg["marks"], f"stall-{os.getpid()}.json")
    try:
        with open(path) as f:
            ask = json.load(f)
    except (OSError, ValueError):
        return
    if ask["where"] != where:
        return
    os.remove(path)
    mark("stall", where=where)
    time.sleep(10**6)


def load_state(t: Any, model: Any, opt: Any) -> int:
    """Load the run's checkpoint into ``model`` / ``opt``; returns the step to go on from
    (0 without one). ``t``: ``lumos.train`` or ``ray.train``."""
    import torch

    ckpt = t.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"]) + 1


def save_state(t: Any, api: str, step: int, model: Any, opt: Any, last: bool) -> None:
    """Report ``step`` with a checkpoint of ``model`` / ``opt``: lumos's ASYNC upload
    (which deletes the directory) except for the last; Ray's only mode."""
    import shutil
    import tempfile

    import torch

    d = tempfile.mkdtemp(prefix="goodput-ckpt-")
    state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}
    torch.save(state, os.path.join(d, "state.pt"))
    kw: dict[str, Any] = {"checkpoint_dir_name": f"step={step:07d}"}
    if api == "lumos" and not last:
        kw["checkpoint_upload_mode"] = t.CheckpointUploadMode.ASYNC  # lumos deletes d
    t.report({"step": step}, checkpoint=t.Checkpoint.from_directory(d), **kw)
    if api == "ray" or last:
        shutil.rmtree(d, ignore_errors=True)


def start_marks(cfg: dict[str, Any], rank: int, step: int, entered: float) -> tuple[Any, Any]:
    """This worker's history file (one JSON line per event) and its ``mark(ev, **kw)``;
    marks the start (resume step, node, pid) at once."""
    import ray

    token = uuid.uuid4().hex[:8]
    out = open(os.path.join(cfg["marks"], f"{rank}-{token}.jsonl"), "a", buffering=1)

    def mark(ev: str, **kw: Any) -> None:
        out.write(
            json.dumps({"ev": ev, "t": time.time(), "rank": rank, "token": token, **kw}) + "\n"
        )

    node = ray.get_runtime_context().get_node_id()
    mark("start", step=step, node=node, pid=os.getpid(), entered=entered)
    return mark, out


def ft_loop(cfg: dict[str, Any]) -> None:
    """The goodput job as torchft replicas (see the module docstring)."""
    import torch

    from lumos import train as t
    from lumos.train.torch import prepare_torchft

    rank = t.get_context().get_world_rank()
    entered = time.time()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ft = prepare_torchft(model, opt)
    start = load_state(t, model, opt)
    if start:  # the fallback: every rank restarted from storage
        ft.resume_from(start)
    mark, out = start_marks(cfg, rank, ft.step, entered)
    while True:
        t0 = time.monotonic()
        maybe_stall(cfg, "before", mark)
        ft.optimizer.zero_grad()  # the quorum; a replacement takes its peer's state here
        step = ft.step
        gen = torch.Generator().manual_seed(step * WORKERS + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = (ft.model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        ft.optimizer.step()
        maybe_stall(cfg, "after", mark)
        if not ft.committed:
            mark("uncommitted", step=step)
            continue
        mark("step", step=step, n=ft.participants())
        stop = _stop_step(cfg)
        last = stop is not None and step >= stop
        if last or step % cfg["every"] == cfg["every"] - 1:
            save_state(t, "lumos", step, model, opt, last)
        else:
            t.report({"step": step})
        if last:
            break
        time.sleep(max(0.0, cfg["step_s"] - (time.monotonic() - t0)))
    out.close()


def stop_step(rows: list[dict[str, Any]]) -> int:
    """The step the driver asks the replicas to stop after: a few past the latest."""
    return max((int(r["step"]) for r in rows if r["ev"] == "step"), default=0) + 3


def recovered(rows: list[dict[str, Any]], rank: int, after: float) -> float | None:
    """When the fault's rank steps again: the first committed step of a worker of that
    rank that started after the fault (the survivors never stopped)."""
    tokens = {
        r["token"] for r in rows if r["ev"] == "start" and r["rank"] == rank and r["t"] > after
    }
    steps = [r["t"] for r in rows if r["ev"] == "step" and r["token"] in tokens]
    return min(steps) if steps else None


def analyse(rows: list[dict[str, Any]], injected: list[Any], wall: tuple[float, float],
            last: int, step_s: float) -> dict[str, Any]:  # fmt: skip
    """Step and sample goodput in total and per fault window, and what each fault cost."""
    started, ended = wall
    by_step: dict[int, tuple[float, int]] = {}
    for r in rows:
        if r["ev"] == "step" and int(r["step"]) <= last:
            t0, n = by_step.get(int(r["step"]), (r["t"], 0))
            by_step[int(r["step"])] = (min(t0, r["t"]), max(n, int(r.get("n", 1))))
    edges = [started] + [f.t for f in injected] + [ended]
    windows = []
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        steps = [(t, n) for t, n in by_step.values() if lo <= t < hi]
        done = injected[i - 1] if i else None
        back = recovered(rows, done.fault.rank, lo) if done is not None else None
        windows.append({
            "kind": done.fault.kind if done is not None else "start (no fault)",
            "span": hi - lo,
            "steps": len(steps),
            "samples": sum(n for _, n in steps) / WORKERS,
            "repeated": sum(1 for r in rows if r["ev"] == "uncommitted" and lo <= r["t"] < hi),
            "back_s": None if back is None else back - lo,
        })  # fmt: skip
    span = ended - started
    return {
        "last": last,
        "wall": span,
        "goodput": (last + 1) * step_s / span if span > 0 else 0.0,
        "sample_goodput": sum(n for _, n in by_step.values()) / WORKERS * step_s / span,
        "windows": windows,
        "attempts": len({r["token"] for r in rows if r["ev"] == "start" and r["rank"] == 0}),
    }


def report(a: dict[str, Any], step_s: float, kinds: tuple[str, ...]) -> dict[str, float]:
    """Print the torchft system's figures; returns step goodput per kind (and 'total')."""
    print(f"\nlumos + TorchftConfig: final checkpoint step {a['last']} -> {a['last'] + 1} "
          f"committed steps, rank-0 workers {a['attempts']}, wall {a['wall']:.0f} s; "
          f"step goodput {a['goodput']:.3f}, sample goodput {a['sample_goodput']:.3f}")  # fmt: skip
    print(f"    {'after':18s} {'n':>2s} {'steps':>8s} {'samples':>8s} {'repeated':>9s} "
          f"{'rank back':>10s}")  # fmt: skip
    out = {"total": a["goodput"]}
    for kind in ["start (no fault)", *kinds]:
        ws = [w for w in a["windows"] if w["kind"] == kind]
        if not ws:
            continue
        span = sum(w["span"] for w in ws)
        g = sum(w["steps"] for w in ws) * step_s / span if span > 0 else 0.0
        s = sum(w["samples"] for w in ws) * step_s / span if span > 0 else 0.0
        backs = [round(w["back_s"], 1) for w in ws if w["back_s"] is not None]
        out[kind] = g
        print(f"    {kind:18s} {len(ws):2d} {g:8.3f} {s:8.3f} "
              f"{sum(w['repeated'] for w in ws):9d}   per fault: back after {backs} s")  # fmt: skip
    return out
