"""Goodput under chaos: lumos.train against ray.train V2 (2.58), same job, same faults, one run.

The job (the same function for both): a 2-rank DDP job (a tiny ``nn.Linear`` under
``DistributedDataParallel``, gloo) whose step is sleep-padded to ``--step-s``; a
checkpoint every ``--every`` steps (lumos: ``CheckpointUploadMode.ASYNC``; Ray: its only
mode), a just-in-time checkpoint when ``get_preemption_info()`` first says so, and a
final one at the end. It runs on a simulated cluster (``lumos.runtime.testing.
simulated_cluster``: a head with 0 CPUs, three 1-CPU worker nodes: one spare).

The faults: a seeded schedule (``--seed``) of kinds and target ranks, replayed
identically for both systems. Fault i is injected ``--every-s`` seconds after fault
i-1, but never before the system trains again after fault i-1 (plus ``MIN_GAP_S``):
a slow recovery delays the next fault instead of stacking it. Kinds:

  kill     SIGKILL of the target rank's worker process.
  node     the target rank's node removed (``Cluster.remove_node``), a new 1-CPU node
           added right after.
  preempt  the target rank's node drained with a 15 s deadline
           (``GcsClient.drain_node``, ``DRAIN_NODE_REASON_PREEMPTION``, as Ray's
           autoscaler does on a spot notice); it is removed at the deadline, whatever
           the system did, and a new node added.
  stuck    the target rank's training thread sleeps forever, before (others wait in
           the all-reduce) or after (others wait in the next step's) the step's
           all-reduce. lumos: its hang watchdog, ``FailureConfig(hang_timeout_s=
           --hang-timeout-s)``; Ray has none and waits out the collective timeout. Both
           get the same ``TorchConfig(timeout_s=--collective-timeout-s)`` (gloo's
           timeout for forming the group and for every collective).

Goodput = (steps that count toward the final model x ``--step-s``) / wall time of
``fit()``. The steps that count are read from the final checkpoint's step and the
history every rank writes (one line per step and attempt start): an attempt's steps
count up to the step the next attempt resumed from. Per fault kind: the same ratio
over the windows that follow faults of that kind (fault -> next fault). Lost per
fault: steps recomputed (steps run after the checkpoint the next attempt resumed
from), time to resume (fault -> first step of the next attempt), time hung (stuck:
stall -> the hang ended; lumos: its watchdog fired, Ray: gloo raised in a waiting
rank).

Goals (issue 26): lumos >= 0.9 goodput with a fault every 60 s; >= 2x Ray's.

``--torchft`` also runs the job with ``TorchftConfig`` (per-step fault tolerance, each
rank a torchft replica) on the same faults first, and prints it beside lumos without it
(``goodput_torchft.py``: the loop, and what counts there: committed steps, and each step
weighted by the replicas that made it).

Run (do NOT set ``RAY_ADDRESS=local``: it starts its own clusters):
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 GLOO_SOCKET_IFNAME=lo RAY_USAGE_STATS_ENABLED=0
RAY_TRAIN_V2_ENABLED=1 python benchmarks/bench_goodput.py [--minutes 10] [--every-s 60]
[--quick] [--skip-ray] [--torchft] [--seed 0]``. The default takes > 20 minutes (both
systems).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
if os.environ.get("RAY_ADDRESS") == "local":
    del os.environ["RAY_ADDRESS"]  # a simulated cluster is joined by its address

import itertools

import ray

from lumos.runtime.testing import simulated_cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goodput_torchft  # beside this file; shipped to workers by value
from ray import cloudpickle

cloudpickle.register_pickle_by_value(goodput_torchft)

KINDS = ("kill", "node", "preempt", "stuck")
WORKERS = 2
NODES = (1, 1, 1)
DEADLINE_S = 15.0  # the preemption notice's deadline
MIN_GAP_S = 5.0  # training time between a recovery and the next fault, at least
WAIT_S = 600.0  # longest wait for a recovery before the next fault is injected anyway


# ----------------------------------------------------------------------------------
# the training function (shipped by value: this file is __main__)
# ----------------------------------------------------------------------------------
def loop(cfg: dict[str, Any]) -> None:
    """DDP steps padded to ``step_s`` until the ``until`` file exists (ranks agree)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if cfg["api"] == "ray":
        import ray.train as t
    else:
        from lumos import train as t  # type: ignore[no-redef]

    rank = t.get_context().get_world_rank()
    entered = time.time()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = goodput_torchft.load_state(t, model, opt)
    mark, out = goodput_torchft.start_marks(cfg, rank, step, entered)
    noticed = False
    while True:
        t0 = time.monotonic()
        gen = torch.Generator().manual_seed(step * WORKERS + rank)
        x = torch.randn(32, 16, generator=gen)
        goodput_torchft.maybe_stall(cfg, "before", mark)
        try:
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP's gradient all-reduce
            opt.step()
            stop = torch.tensor([1 if os.path.exists(cfg["until"]) else 0])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        except Exception as exc:
            mark("coll_error", error=f"{type(exc).__name__}: {str(exc)[:120]}")
            raise
        goodput_torchft.maybe_stall(cfg, "after", mark)
        last = bool(stop.item())
        mark("step", step=step)
        jit = False
        polls = step % cfg["notice_every"] == 0  # Ray's call is a broadcast of all ranks
        if not noticed and polls and t.get_preemption_info() is not None:
            noticed = jit = True
            mark("notice", step=step)
        if last or jit or step % cfg["every"] == cfg["every"] - 1:
            goodput_torchft.save_state(t, cfg["api"], step, model, opt, last)
            mark("ckpt", step=step, jit=jit)
        else:
            t.report({"step": step})
        if last:
            break
        step += 1
        time.sleep(max(0.0, cfg["step_s"] - (time.monotonic() - t0)))
    out.close()


# ----------------------------------------------------------------------------------
# driver side
# ----------------------------------------------------------------------------------
def _records(marks: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in glob.glob(os.path.join(marks, "*.jsonl")):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f if line.endswith("\n"))
    rows.sort(key=lambda r: r["t"])
    return rows


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: its kind, target rank and (stuck) where it sleeps."""

    kind: str
    rank: int
    where: str


def schedule(seed: int, count: int, kinds: tuple[str, ...]) -> list[Fault]:
    """``count`` faults, the kinds in seeded shuffled rounds (each kind as often)."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        block = list(kinds)
        rng.shuffle(block)
        order.extend(block)
    return [
        Fault(k, rng.randrange(WORKERS), rng.choice(("before", "after"))) for k in order[:count]
    ]


@dataclass
class Injected:
    """What the driver did for one fault and when."""

    fault: Fault
    t: float
    done_t: float = 0.0  # the fault's own actions ended (a node removed at its deadline)
    detail: str = ""


class Fit:
    """``fit()`` of one system in a thread, so the driver can inject faults."""

    def __init__(self, cfg: dict[str, Any], storage: str, args: argparse.Namespace) -> None:
        self.cfg = cfg
        self.error: BaseException | None = None
        self.result: Any = None
        self.started = self.ended = 0.0
        make = _ray_trainer if cfg["api"] == "ray" else _lumos_trainer
        self.trainer = make(cfg, storage, args)
        self.thread = threading.Thread(target=self._fit, daemon=True)
        self.started = time.time()
        self.thread.start()

    def _fit(self) -> None:
        try:
            self.result = self.trainer.fit()
        except BaseException as exc:
            self.error = exc
        self.ended = time.time()

    def alive(self) -> bool:
        return self.thread.is_alive()


def _lumos_trainer(cfg: dict[str, Any], storage: str, args: argparse.Namespace) -> Any:
    from lumos import train
    from lumos.train.torch import TorchConfig, TorchftConfig, TorchTrainer

    failure = train.FailureConfig(max_failures=-1, hang_timeout_s=args.hang_timeout_s)
    ft = cfg["api"] == "lumos-ft"
    torch_config = (
        TorchftConfig(timeout_s=args.collective_timeout_s)
        if ft
        else TorchConfig(backend="gloo", timeout_s=args.collective_timeout_s)
    )
    return TorchTrainer(
        goodput_torchft.ft_loop if ft else loop,
        train_loop_config=cfg,
        torch_config=torch_config,
        scaling_config=train.ScalingConfig(num_workers=WORKERS),
        run_config=train.RunConfig(
            name=f"lumos-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            verbose=args.verbose,
            failure_config=failure,
            checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        ),
    )


def _ray_trainer(cfg: dict[str, Any], storage: str, args: argparse.Namespace) -> Any:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        loop,
        train_loop_config=cfg,
        torch_config=TorchConfig(backend="gloo", timeout_s=int(args.collective_timeout_s)),
        scaling_config=ray.train.ScalingConfig(num_workers=WORKERS),
        run_config=ray.train.RunConfig(
            name=f"ray-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            failure_config=ray.train.FailureConfig(max_failures=-1),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )


def _latest_start(rows: list[dict[str, Any]], rank: int) -> dict[str, Any] | None:
    starts = [r for r in rows if r["ev"] == "start" and r["rank"] == rank]
    return starts[-1] if starts else None


def _remove(cluster: Any, node_id: str) -> bool:
    nodes = [n for n in cluster.list_all_nodes() if n.node_id == node_id]
    if not nodes:
        return False
    cluster.remove_node(nodes[0])
    return True


def inject(fault: Fault, cluster: Any, marks: str, rows: list[dict[str, Any]]) -> Injected:
    """Inject one fault on the target rank's current worker; returns what was done."""
    start = _latest_start(rows, fault.rank)
    assert start is not None, "no worker started yet"
    now = time.time()
    out = Injected(fault, now)
    if fault.kind == "kill":
        try:
            os.kill(int(start["pid"]), signal.SIGKILL)
            out.detail = f"pid {start['pid']}"
        except ProcessLookupError:
            out.detail = f"pid {start['pid']} already gone"
    elif fault.kind == "stuck":
        path = os.path.join(marks, f"stall-{start['pid']}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"where": fault.where}, f)
        os.replace(path + ".tmp", path)
        out.detail = f"pid {start['pid']} {fault.where} the all-reduce"
    elif fault.kind == "node":
        out.detail = f"node {start['node'][:8]} removed: {_remove(cluster, start['node'])}"
        _add_node(cluster)
    else:
        out.detail = _preempt(cluster, start["node"])
    out.done_t = time.time()
    return out


def _add_node(cluster: Any, tries: int = 3) -> None:
    """A new 1-CPU node (retried: on a loaded machine its start may time out)."""
    for attempt in range(tries):
        try:
            cluster.add_node(num_cpus=1)
            return
        except Exception as exc:
            if attempt == tries - 1:
                raise
            print(f"    adding a node failed ({exc}); again", flush=True)
            time.sleep(5)


def _preempt(cluster: Any, node_id: str) -> str:
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=cluster.address)  # type: ignore[attr-defined]
    deadline = time.time() + DEADLINE_S
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")  # type: ignore[attr-defined]
    accepted, why = gcs.drain_node(
        node_id, reason, "spot reclaimed (bench_goodput)", int(deadline * 1000)
    )
    time.sleep(max(0.0, deadline - time.time()))  # the instance goes away at the deadline
    removed = _remove(cluster, node_id)
    _add_node(cluster)
    return f"node {node_id[:8]} drained (accepted {accepted} {why or ''}), removed {removed}"


def _resumed_at(rows: list[dict[str, Any]], after: float) -> float | None:
    """The first rank-0 step of an attempt that started after ``after``."""
    tokens = {r["token"] for r in rows if r["ev"] == "start" and r["rank"] == 0 and r["t"] > after}
    steps = [r["t"] for r in rows if r["ev"] == "step" and r["rank"] == 0 and r["token"] in tokens]
    return min(steps) if steps else None


def _recovered(rows: list[dict[str, Any]], done: Injected) -> float | None:
    """When the system trains again after ``done``: the first rank-0 step of an attempt
    that started after the fault (a preemption: any rank-0 attempt that made 3 steps
    after the node's removal, the one that moved in time included)."""
    if done.fault.kind != "preempt":
        return _resumed_at(rows, done.t)
    steps: dict[str, list[float]] = {}
    for r in rows:
        if r["ev"] == "step" and r["rank"] == 0 and r["t"] > done.done_t:
            steps.setdefault(r["token"], []).append(r["t"])
    return min((ts[0] for ts in steps.values() if len(ts) >= 3), default=None)


def _wait(run: Fit, marks: str, ok: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.alive():
        found = ok(_records(marks))
        if found:
            return found
        time.sleep(0.1)
    return None


@contextmanager
def _started_cluster(tries: int = 3) -> Iterator[Any]:
    """``simulated_cluster(NODES)``, retried: on a loaded machine Ray's head node may
    time out while starting."""
    for attempt in range(tries):
        cm = simulated_cluster(NODES)
        try:
            cluster = cm.__enter__()
        except Exception as exc:
            if attempt == tries - 1:
                raise
            print(f"    the simulated cluster did not start ({exc}); again", flush=True)
            time.sleep(10)
            continue
        try:
            yield cluster
        finally:
            cm.__exit__(None, None, None)
        return


def drive(api: str, faults: list[Fault], args: argparse.Namespace) -> dict[str, Any]:
    """One system's run under the schedule; returns the history and the records."""
    marks = tempfile.mkdtemp(prefix=f"bench-goodput-{api}-")
    storage = tempfile.mkdtemp(prefix="bench-goodput-storage-")
    cfg = {"api": api, "marks": marks, "until": os.path.join(marks, "until"),
           "every": args.every, "step_s": args.step_s,
           "notice_every": args.notice_every}  # fmt: skip
    injected: list[Injected] = []
    with _started_cluster() as cluster:
        run = Fit(cfg, storage, args)
        ready = _wait(run, marks, lambda rs: _resumed_at(rs, 0.0), WAIT_S)
        previous, resumed = time.time(), ready or time.time()
        for i, fault in enumerate(faults):
            at = max(previous + args.every_s, resumed + MIN_GAP_S)
            while time.time() < at and run.alive():
                time.sleep(0.05)
            if not run.alive():
                break
            done = inject(fault, cluster, marks, _records(marks))
            injected.append(done)
            print(f"    {api} fault {i}: {fault.kind} rank {fault.rank} ({done.detail}) "
                  f"at +{done.t - run.started:.0f} s", flush=True)  # fmt: skip
            if api == "lumos-ft":
                back = _wait(run, marks, lambda rs: goodput_torchft.recovered(
                    rs, done.fault.rank, done.t), WAIT_S)  # fmt: skip
            else:
                back = _wait(run, marks, lambda rs: _recovered(rs, done), WAIT_S)
            previous, resumed = done.t, back or time.time()
        while time.time() < previous + args.every_s and run.alive():
            time.sleep(0.05)
        with open(cfg["until"], "w") as f:  # (the DDP loop only looks for the file)
            f.write(str(goodput_torchft.stop_step(_records(marks))))
        run.thread.join(WAIT_S)
    return {"api": api, "run": run, "rows": _records(marks), "injected": injected,
            "storage": storage}  # fmt: skip


# ----------------------------------------------------------------------------------
# what counts: the final checkpoint's step and the history
# ----------------------------------------------------------------------------------
def final_step(api: str, result: Any) -> int:
    """The step of the final model: read from the run's final checkpoint."""
    import torch

    if result is None or result.checkpoint is None:
        return -1
    with result.checkpoint.as_directory() as d:
        return int(torch.load(os.path.join(d, "state.pt"), weights_only=True)["step"])


@dataclass
class Attempt:
    """One attempt as rank 0 saw it: where it resumed, its steps (step, t)."""

    t: float
    start: int
    steps: list[tuple[int, float]] = field(default_factory=list)
    counts_below: int = 0  # its steps below this count (the next attempt resumed there)


def attempts(rows: list[dict[str, Any]], last: int) -> list[Attempt]:
    """Rank 0's attempts in order, each knowing which of its steps count."""
    by_token: dict[str, Attempt] = {}
    for r in rows:
        if r["rank"] != 0:
            continue
        if r["ev"] == "start":
            by_token[r["token"]] = Attempt(r["t"], int(r["step"]))
        elif r["ev"] == "step" and r["token"] in by_token:
            by_token[r["token"]].steps.append((int(r["step"]), r["t"]))
    out = sorted(by_token.values(), key=lambda a: a.t)
    for a, b in zip(out, [*out[1:], None]):
        a.counts_below = b.start if b is not None else last + 1
    return out


def _hang_ends(system: dict[str, Any]) -> list[float]:
    """When each hang ended: lumos's watchdog fired (hang.json), Ray's gloo raised."""
    if system["api"] == "lumos":
        ends = []
        for path in glob.glob(
            os.path.join(system["storage"], "*", "_lumos", "hangs", "*", "hang.json")
        ):
            with open(path) as f:
                ends.append(float(json.load(f)["fired_at_unix"]))
        return sorted(ends)
    return [r["t"] for r in system["rows"] if r["ev"] == "coll_error"]


@dataclass
class Lost:
    """What one fault cost."""

    kind: str
    window_s: float
    counted: int  # steps run in the window that count
    recomputed: int
    resume_s: float | None
    hung_s: float | None


def analyse(system: dict[str, Any], step_s: float) -> dict[str, Any]:
    """Goodput in total and per fault kind, and what each fault cost."""
    run, rows = system["run"], system["rows"]
    last = final_step(system["api"], run.result)
    atts = attempts(rows, last)
    counted = sorted(t for a in atts for s, t in a.steps if s < a.counts_below)
    wall = run.ended - run.started
    injected: list[Injected] = system["injected"]
    edges = [run.started] + [f.t for f in injected] + [run.ended]
    ends, losses = _hang_ends(system), []
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        kind = "start (no fault)" if i == 0 else injected[i - 1].fault.kind
        n = sum(1 for t in counted if lo <= t < hi)
        if i == 0:
            losses.append(Lost(kind, hi - lo, n, 0, None, None))
            continue
        running = [a for a in atts if a.t <= lo]
        redo = (
            sum(1 for s, t in running[-1].steps if s >= running[-1].counts_below) if running else 0
        )
        back = _resumed_at(rows, lo)
        hung = None
        if kind == "stuck":
            stall = min((r["t"] for r in rows if r["ev"] == "stall" and r["t"] >= lo), default=None)
            end = min((e for e in ends if stall is not None and e >= stall), default=None)
            hung = None if stall is None or end is None else end - stall
        losses.append(Lost(kind, hi - lo, n, redo, None if back is None else back - lo, hung))
    intervals = [b - a for a, b in itertools.pairwise(counted) if b - a < 3 * step_s]
    return {"last": last, "counted": len(counted), "wall": wall, "losses": losses,
            "goodput": (last + 1) * step_s / wall if wall > 0 else 0.0,
            "median_step_s": statistics.median(intervals) if intervals else float("nan"),
            "attempts": len(atts), "error": run.error}  # fmt: skip


def _fmt(x: float | None, unit: str = " s") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}{unit}"


def report(api: str, a: dict[str, Any], step_s: float) -> dict[str, float]:
    """Print one system's figures; returns goodput per kind (and 'total')."""
    print(f"\n{api}: final checkpoint step {a['last']} -> {a['last'] + 1} steps count "
          f"(history: {a['counted']}), {a['attempts']} attempts, wall {a['wall']:.0f} s, "
          f"median step {a['median_step_s'] * 1000:.0f} ms; goodput {a['goodput']:.3f}"
          + (f"; fit() raised {a['error']!r:.200}" if a["error"] else ""))  # fmt: skip
    out = {"total": a["goodput"]}
    print(f"    {'after':18s} {'n':>2s} {'goodput':>8s} {'recomputed':>10s} "
          f"{'to resume':>10s} {'hung':>8s}")  # fmt: skip
    for kind in ["start (no fault)", *KINDS]:
        ls = [x for x in a["losses"] if x.kind == kind]
        if not ls:
            continue
        span = sum(x.window_s for x in ls)
        g = sum(x.counted for x in ls) * step_s / span if span > 0 else 0.0
        out[kind] = g
        resumes = [x.resume_s for x in ls if x.resume_s is not None]
        hungs = [x.hung_s for x in ls if x.hung_s is not None]
        print(f"    {kind:18s} {len(ls):2d} {g:8.3f} {sum(x.recomputed for x in ls):10d} "
              f"{_fmt(statistics.mean(resumes) if resumes else None):>10s} "
              f"{_fmt(statistics.mean(hungs) if hungs else None):>8s}"
              f"   per fault: resume {[round(r, 1) for r in resumes]}")  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="faulted time per system")
    parser.add_argument("--every-s", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--step-s", type=float, default=0.5, help="fault-free step time")
    parser.add_argument("--every", type=int, default=4, help="a checkpoint every N steps")
    parser.add_argument("--hang-timeout-s", type=float, default=3.0)
    parser.add_argument(
        "--notice-every", type=int, default=1,
        help="call get_preemption_info() every N steps (Ray's is a broadcast through its "
        "synchronization actor: on a loaded machine ~1.5 s a call)",
    )  # fmt: skip
    parser.add_argument("--collective-timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="one fault of each kind, short")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--skip-lumos", action="store_true", help="Ray only (no ratios)")
    parser.add_argument("--torchft", action="store_true",
                        help="also lumos with TorchftConfig (per-step fault tolerance)")  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="lumos's console lines")
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    for k in kinds:
        if k not in KINDS:
            parser.error(f"--kinds: unknown kind {k!r}; allowed: {', '.join(KINDS)}")
    if args.quick:
        args.every_s, args.collective_timeout_s = 15.0, 30.0
        args.minutes = len(kinds) * args.every_s / 60
    count = max(1, round(args.minutes * 60 / args.every_s))
    faults = schedule(args.seed, count, kinds)
    print(f"bench_goodput: {WORKERS} DDP ranks (gloo) on {len(NODES)} 1-CPU nodes, step "
          f"{args.step_s} s, checkpoint every {args.every} steps, {count} faults every "
          f"{args.every_s:.0f} s (seed {args.seed}): {[f.kind for f in faults]}; "
          f"hang_timeout_s {args.hang_timeout_s} (lumos), collective timeout "
          f"{args.collective_timeout_s:.0f} s (both); cores {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    apis = [a for a in ("lumos", "ray") if not getattr(args, f"skip_{a}")]
    figures: dict[str, dict[str, float]] = {}
    if args.torchft:
        print("=== lumos-ft ===", flush=True)
        system = drive("lumos-ft", faults, args)
        run = system["run"]
        a = goodput_torchft.analyse(system["rows"], system["injected"], (run.started, run.ended),
                                    final_step("lumos", run.result), args.step_s)  # fmt: skip
        figures["lumos-ft"] = goodput_torchft.report(a, args.step_s, kinds)
    for api in apis:
        print(f"=== {api} ===", flush=True)
        system = drive(api, faults, args)
        figures[api] = report(api, analyse(system, args.step_s), args.step_s)
    if "lumos-ft" in figures and "lumos" in figures:
        for kind, g in figures["lumos-ft"].items():
            base = figures["lumos"].get(kind, 0.0)
            print(f"    lumos with / without TorchftConfig {kind:18s}: {g:.3f} / {base:.3f}")
    lumos = figures["lumos"]["total"] if "lumos" in figures else float("nan")
    print(f"\nlumos goodput {lumos:.3f} (goal >= 0.9): {'OK' if lumos >= 0.9 else 'MISSED'}")
    if "ray" in figures and "lumos" in figures:
        ray_g = figures["ray"]
        for kind, g in figures["lumos"].items():
            r = ray_g.get(kind, 0.0)
            print(f"    lumos / ray {kind:18s}: {g:.3f} / {r:.3f} = "
                  f"{(g / r) if r > 0 else float('inf'):.2f}x")  # fmt: skip
        ratio = lumos / ray_g["total"] if ray_g["total"] > 0 else float("inf")
        print(f"lumos / ray goodput: {ratio:.2f}x (goal >= 2x): {'OK' if ratio >= 2 else 'MISSED'}")
    sys.stdout.flush()
    os._exit(0)  # a Ray fit() thread may still wait in a stuck run


if __name__ == "__main__":
    sys.exit(main())
