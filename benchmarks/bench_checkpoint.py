"""Checkpoint reporting: lumos.train against ray.train V2 (2.58), in the same run.

Budget (DESIGN.md, second wave; issue 11):
  (1) training-thread stall per ``report()`` with a 256 MiB checkpoint (16 x 16 MiB of
      random bytes), 2 CPU workers, rank 0 checkpoints (the other rank reports metrics
      only: Ray's docs pattern), to local disk and to a moto S3 server on loopback:
      lumos ASYNC at most 0.2x lumos SYNC and at most 1.0x Ray ASYNC; lumos SYNC at
      most 0.8x Ray SYNC and at most 1.2x the floor (issue 31). A plain copy of the
      same files (``shutil.copytree`` / s3fs ``put``, in a Ray task like the workers)
      is printed for reference, and the floor: that copy plus what durability truly
      needs on local disk (fsync of every file, then of the folders, and a small state
      document written, fsynced and renamed; on S3 the put alone: durable on return).
      lumos fsyncs the same; Ray Train fsyncs neither files nor state.
  (2) 10 reports, each after ~0.3 s of "training", with ASYNC 256 MiB checkpoints to
      local disk: the run at most 1.1x the same run without checkpoints (Ray's ratio
      printed for reference). "The run" is rank 0's training function start -> fit()
      returned, so it includes draining the last uploads.

How the stall is measured: rank 0 times its ``report()`` call (``perf_counter``) and
writes the times to a file. One run per framework and target reports n times SYNC,
then n times ASYNC; the first report of each mode is a warm-up, not counted.
Every report reuses the same source directory with
``delete_local_checkpoint_after_upload=False`` (lumos snapshots it with hard links;
Ray uploads it from its thread and never modifies it), so writing the source is never
measured. SYNC reports are 2.2 s apart (Ray's controller takes one report per
2 s poll); ASYNC reports are spaced by more than an upload takes (1.5x the same
framework's SYNC median, at least 0.5 s): the figure is the hand-over, not
back-pressure from a full queue, as when checkpoints are minutes apart. Both
frameworks keep 2 checkpoints; ``os.sync()`` runs before every run.

Run: ``RAY_TRAIN_V2_ENABLED=1 python benchmarks/bench_checkpoint.py [--reps N]
[--quick] [--skip-ray] [--skip-s3] [--work sleep|torch]`` (or
``nox -s bench -- bench_checkpoint.py``). Ray needs pyarrow (``ray[train]``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from lumos import train
from lumos.train.torch import TorchTrainer

MIB = 1024 * 1024
NUM_FILES = 16
FILE_MIB = 16
BUDGET_ASYNC_VS_SYNC = 0.2
BUDGET_ASYNC_VS_RAY = 1.0
BUDGET_SYNC_VS_RAY = 0.8
BUDGET_SYNC_VS_FLOOR = 1.2
BUDGET_RUN_VS_NO_CKPT = 1.1
RUN_REPORTS = 10
RUN_WORK_S = 0.3
# SYNC reports are spaced by more than Ray's controller poll (2 s): a Ray report waits for
# the poll to take its previous one, which would add to Ray's stall what is not a persist
SYNC_GAP_S = 2.2

# What the lumos under test offers (the ASYNC API of issue 11 may not have landed yet).
LUMOS_MODES: Any = getattr(train, "CheckpointUploadMode", None)
LUMOS_HAS_ASYNC = LUMOS_MODES is not None and hasattr(LUMOS_MODES, "ASYNC")
LUMOS_HAS_UPLOAD_MODE = "checkpoint_upload_mode" in inspect.signature(train.report).parameters


# ----------------------------------------------------------------------------------
# training functions (shipped by value: this file is __main__)
# ----------------------------------------------------------------------------------
def _work(kind: str, seconds: float, torch_steps_per_s: float) -> None:
    """``seconds`` of "training": a sleep, or a fixed number of small torch steps."""
    if kind == "sleep":
        time.sleep(seconds)
        return
    import torch

    torch.set_num_threads(1)
    a = torch.ones(256, 256) / 256
    for _ in range(int(seconds * torch_steps_per_s)):
        a = torch.tanh(a @ a)


def _from_rank0(value: float) -> float:
    """Rank 0's ``value`` on every rank (the torch trainers set up a gloo group)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, 0)
    return float(t.item())


def _loop(cfg: dict[str, Any], rank: int, report: Callable[..., None], ckpt: Any) -> None:
    """Per phase (upload mode), ``n`` x (work, report); rank 0 times its report() calls.

    With ``adapt_gap``, the work before each report of the next phase lasts 1.5x this
    phase's median stall (so an ASYNC upload is done before the next report).
    """
    res: dict[str, Any] = {"t_start": time.time()}
    work_s = cfg["work_s"]
    for phase, mode in cfg["phases"]:
        kwargs = {} if mode is None else {"checkpoint_upload_mode": mode}
        if mode is not None and cfg["src"]:
            kwargs["delete_local_checkpoint_after_upload"] = False
        stalls = []
        for i in range(cfg["n"]):
            gap = work_s if i or not cfg["adapt_gap"] else SYNC_GAP_S  # nothing in flight
            _work(cfg["work"], gap, cfg["torch_steps_per_s"])
            name = f"{phase}_{i:04d}"
            t = time.perf_counter()
            if cfg["src"] and rank == 0:
                report({"i": i}, checkpoint=ckpt(cfg["src"]), checkpoint_dir_name=name, **kwargs)
            elif cfg["src"] and cfg["empty"]:  # a lumos without the rank-0-only pattern
                report({"i": i}, checkpoint=ckpt(cfg["empty"]), checkpoint_dir_name=name, **kwargs)
            else:  # metrics only, same mode (Ray's SYNC metrics-only report waits on a queue)
                report({"i": i}, **kwargs)
            stalls.append(time.perf_counter() - t)
        res[phase] = stalls
        if cfg["adapt_gap"] and phase == "SYNC":
            res["gap_s"] = work_s = _from_rank0(max(0.5, 1.5 * statistics.median(stalls[1:])))
    res["t_loop_end"] = time.time()
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump(res, f)


def lumos_fn(cfg: dict[str, Any]) -> None:
    # phase None: a lumos before issue 11 (no upload modes; its report() is SYNC)
    phases = [(p or "SYNC", p and getattr(train.CheckpointUploadMode, p)) for p in cfg["phases"]]
    rank = train.get_context().get_world_rank()
    _loop(dict(cfg, phases=phases), rank, train.report, train.Checkpoint.from_directory)


def ray_fn(cfg: dict[str, Any]) -> None:
    import ray.train

    phases = [(p, getattr(ray.train.CheckpointUploadMode, p)) for p in cfg["phases"]]
    rank = ray.train.get_context().get_world_rank()
    _loop(dict(cfg, phases=phases), rank, ray.train.report, ray.train.Checkpoint.from_directory)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable(dest: str) -> None:
    """What durability truly needs after a copy to local disk: every file fsynced, then
    the folders naming them, and a small state document written, fsynced and renamed."""
    for root, _dirs, files in os.walk(dest):
        for name in files:
            _fsync_path(os.path.join(root, name))
    for root, _dirs, _files in os.walk(dest, topdown=False):
        _fsync_path(root)
    _fsync_path(os.path.dirname(dest))
    tmp, state = dest + ".state.tmp", dest + ".state.json"
    with open(tmp, "wb") as f:
        f.write(b'{"checkpoints": ["x"]}' * 40)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state)
    _fsync_path(os.path.dirname(dest))
    os.unlink(state)


@ray.remote(num_cpus=1)
def plain_copy(src: str, dest: str, fs: Any, durable: bool = False) -> float:
    """A plain copy of the checkpoint files from a Ray worker process (as the uploads run);
    ``durable``: plus the fsyncs and the state write durability needs (local disk; an
    object store's put is durable once it returned)."""
    t = time.perf_counter()
    if fs is None:
        shutil.copytree(src, dest)
        if durable:
            _durable(dest)
    else:
        fs.put(src, dest, recursive=True)
    return time.perf_counter() - t


# ----------------------------------------------------------------------------------
# where checkpoints go
# ----------------------------------------------------------------------------------
class LocalTarget:
    name = "local disk"

    def __init__(self, work: str) -> None:
        self.root = os.path.join(work, "runs")

    def lumos(self) -> tuple[str, Any]:
        return self.root, None

    def ray(self) -> tuple[str, Any]:
        return self.root, None

    def plain(self, src: str, i: int, durable: bool = False) -> float:
        dest = os.path.join(self.root, f"plain-{i}")
        try:
            return float(ray.get(plain_copy.remote(src, dest, None, durable)))
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def shards(self) -> int:
        return sum(n.startswith("shard_") for _, _, fs in os.walk(self.root) for n in fs)

    def clean(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(self.root)
        os.sync()


class S3Target:
    name = "moto S3"

    def __init__(self, server: Any) -> None:
        self.server = server
        self.fs = server.filesystem()
        self.bucket = ""
        self.clean()

    def lumos(self) -> tuple[str, Any]:
        return f"s3://{self.bucket}/lumos", self.server.filesystem()

    def ray(self) -> tuple[str, Any]:
        pafs = importlib.import_module("pyarrow.fs")  # ray[train] needs it; may lack stubs
        from lumos.storage.testing import DUMMY_KEY, DUMMY_SECRET, REGION

        host = self.server.endpoint_url.split("://", 1)[1]
        fs = pafs.S3FileSystem(access_key=DUMMY_KEY, secret_key=DUMMY_SECRET, region=REGION,
                               endpoint_override=host, scheme="http")  # fmt: skip
        return f"{self.bucket}/ray", fs

    def plain(self, src: str, i: int, durable: bool = False) -> float:
        return float(ray.get(plain_copy.remote(src, f"{self.bucket}/plain-{i}/", self.fs)))

    def shards(self) -> int:
        return sum("/shard_" in p for p in self.fs.find(self.bucket))

    def clean(self) -> None:  # a fresh bucket per run; moto keeps objects in memory
        if self.bucket:
            self.fs.rm(self.bucket, recursive=True)
        self.bucket = self.server.create_bucket()
        os.sync()


def fit(framework: str, target: Any, cfg: dict[str, Any], work: str) -> dict[str, Any] | None:
    """One 2-worker run; rank 0's figures plus ``t_done`` (fit returned), or None on error."""
    target.clean()
    out = os.path.join(work, f"out-{time.time_ns()}.json")
    cfg = dict(cfg, out=out)
    name = f"{framework}-{time.time_ns()}"
    try:
        if framework == "lumos":
            path, fs = target.lumos()
            TorchTrainer(
                lumos_fn,
                train_loop_config=cfg,
                scaling_config=train.ScalingConfig(num_workers=2),
                run_config=train.RunConfig(
                    name=name,
                    storage_path=path,
                    storage_filesystem=fs,
                    checkpoint_config=train.CheckpointConfig(num_to_keep=2),
                    verbose=False,
                ),
            ).fit()
        else:
            import ray.train
            from ray.train.torch import TorchTrainer as RayTorchTrainer

            path, fs = target.ray()
            RayTorchTrainer(
                ray_fn,
                train_loop_config=cfg,
                scaling_config=ray.train.ScalingConfig(num_workers=2),
                run_config=ray.train.RunConfig(
                    name=name,
                    storage_path=path,
                    storage_filesystem=fs,
                    checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
                ),
            ).fit()
    except Exception:  # print and go on: the other rows still mean something
        print(f"    ERROR {framework} {cfg['phases']} on {target.name}:", flush=True)
        traceback.print_exc(limit=3)
        return None
    t_done = time.time()
    with open(out) as f:
        res: dict[str, Any] = json.load(f)
    res["t_done"] = t_done
    shards = target.shards()  # the kept checkpoints hold every file (nothing silently lost)
    if cfg["src"] and (not shards or shards % NUM_FILES):
        print(f"    WARNING {framework}: {shards} checkpoint files in storage", flush=True)
    return res


def base_cfg(args: argparse.Namespace, src: str, empty: str) -> dict[str, Any]:
    return {
        "src": src,
        # a lumos without issue 11's rank-0-only pattern needs every rank to pass one
        "empty": "" if LUMOS_HAS_UPLOAD_MODE else empty,
        "phases": ["SYNC", "ASYNC"],
        "adapt_gap": True,
        "work": "sleep",
        "work_s": SYNC_GAP_S,
        "torch_steps_per_s": args.torch_steps_per_s,
        "n": args.reps + 1,
    }


def _verdict(ratio: float | None, budget: float) -> str:
    if ratio is None:
        return "SKIP"
    return "OK  " if ratio <= budget else "FAIL"


def _ratio_line(label: str, num: float | None, den: float | None, budget: float) -> None:
    ratio = num / den if num is not None and den else None
    shown = f"{ratio:.3g}x" if ratio is not None else "n/a (a side did not run)"
    print(f"    {_verdict(ratio, budget)} {label} = {shown} (budget <= {budget}x)", flush=True)


def _row(
    label: str, stalls: list[float] | None, note: str = "run failed (see ERROR above)"
) -> float | None:
    if stalls is None:
        print(f"    {label:<34} SKIP {note}", flush=True)
        return None
    med = statistics.median(stalls)
    runs = [round(s * 1000, 1) for s in stalls]
    print(f"    {label:<34} {med * 1000:9.1f} ms   (min {min(stalls) * 1000:7.1f})   "
          f"reports (ms): {runs}", flush=True)  # fmt: skip
    return med


# ----------------------------------------------------------------------------------
# (1) stall per report
# ----------------------------------------------------------------------------------
def stall_section(target: Any, args: argparse.Namespace, src: str, empty: str, work: str) -> None:
    print(f"\n(1) training-thread stall per report(), 256 MiB checkpoint to {target.name}, "
          f"rank 0, median over {args.reps} reports per mode (first dropped)", flush=True)  # fmt: skip
    plain = [target.plain(src, i) for i in range(args.reps + 1)][1:]
    _row("plain copy (reference)", plain)
    floor = [target.plain(src, i, durable=True) for i in range(args.reps + 1)][1:]
    floor_med = _row("floor: copy + fsync + state write", floor)
    med: dict[tuple[str, str], float | None] = {}
    for fw in ["lumos"] + ([] if args.skip_ray else ["ray"]):
        cfg = base_cfg(args, src, empty)
        if fw == "lumos" and not LUMOS_HAS_ASYNC:  # SYNC only; SYNC as today before issue 11
            cfg["phases"] = ["SYNC" if LUMOS_HAS_UPLOAD_MODE else None]
        res = fit(fw, target, cfg, work)
        name = "lumos.train" if fw == "lumos" else "ray.train V2"
        for mode in ("SYNC", "ASYNC"):
            stalls = res[mode][1:] if res and mode in res else None
            note = "run failed (see ERROR above)"
            if fw == "lumos" and mode == "ASYNC" and not LUMOS_HAS_ASYNC:
                note = "lumos ASYNC not available yet (no train.CheckpointUploadMode.ASYNC)"
            legacy = fw == "lumos" and not LUMOS_HAS_UPLOAD_MODE
            med[fw, mode] = _row(f"{name} {mode}" + (" (all ranks ckpt)" if legacy else ""),
                                 stalls, note)  # fmt: skip
        if res and "gap_s" in res:
            print(f"    {'':<34} ({name} ASYNC reports {res['gap_s']:.2f} s apart)")
    _ratio_line("lumos ASYNC / lumos SYNC", med["lumos", "ASYNC"], med["lumos", "SYNC"],
                BUDGET_ASYNC_VS_SYNC)  # fmt: skip
    _ratio_line("lumos SYNC / floor", med["lumos", "SYNC"], floor_med, BUDGET_SYNC_VS_FLOOR)
    if args.skip_ray:
        return
    _ratio_line("lumos ASYNC / Ray ASYNC", med["lumos", "ASYNC"], med["ray", "ASYNC"],
                BUDGET_ASYNC_VS_RAY)  # fmt: skip
    _ratio_line("lumos SYNC / Ray SYNC", med["lumos", "SYNC"], med["ray", "SYNC"],
                BUDGET_SYNC_VS_RAY)  # fmt: skip


# ----------------------------------------------------------------------------------
# (2) a 10-report run with and without ASYNC checkpoints
# ----------------------------------------------------------------------------------
def run_section(target: Any, args: argparse.Namespace, src: str, empty: str, work: str) -> None:
    print(f"\n(2) {RUN_REPORTS} reports, each after {RUN_WORK_S} s of {args.work} work, "
          f"ASYNC 256 MiB checkpoints to {target.name} vs none; run = rank 0 start -> "
          "fit() returned", flush=True)  # fmt: skip
    cfg = dict(base_cfg(args, src, empty), n=RUN_REPORTS, work=args.work, work_s=RUN_WORK_S,
               phases=["ASYNC"], adapt_gap=False)  # fmt: skip
    ratios: dict[str, float | None] = {}
    for fw in ["lumos"] + ([] if args.skip_ray else ["ray"]):
        label = "lumos.train" if fw == "lumos" else "ray.train V2"
        if fw == "lumos" and not LUMOS_HAS_ASYNC:
            print(f"    {label:<14} SKIP lumos ASYNC not available yet "
                  "(no train.CheckpointUploadMode.ASYNC)", flush=True)  # fmt: skip
            ratios[fw] = None
            continue
        runs: dict[str, list[float]] = {"none": [], "ASYNC": []}
        loops: dict[str, list[float]] = {"none": [], "ASYNC": []}
        for _ in range(args.run_reps if fw == "lumos" else 1):
            for variant in ("none", "ASYNC"):
                c = dict(cfg, src="" if variant == "none" else src)
                res = fit(fw, target, c, work)
                if res:
                    runs[variant].append(res["t_done"] - res["t_start"])
                    loops[variant].append(res["t_loop_end"] - res["t_start"])
        if not runs["none"] or not runs["ASYNC"]:
            ratios[fw] = None
            continue
        r_none, r_ckpt = statistics.median(runs["none"]), statistics.median(runs["ASYNC"])
        l_none, l_ckpt = statistics.median(loops["none"]), statistics.median(loops["ASYNC"])
        ratios[fw] = r_ckpt / r_none
        print(f"    {label:<14} no checkpoints {r_none:6.2f} s (loop {l_none:5.2f})   "
              f"ASYNC {r_ckpt:6.2f} s (loop {l_ckpt:5.2f})   ratio {ratios[fw]:.2f}x "
              f"(loop {l_ckpt / l_none:.2f}x)", flush=True)  # fmt: skip
    lr = ratios["lumos"]
    shown = f"{lr:.2f}x" if lr is not None else "n/a"
    print(f"    {_verdict(lr, BUDGET_RUN_VS_NO_CKPT)} lumos ASYNC run / no-checkpoint run = "
          f"{shown} (budget <= {BUDGET_RUN_VS_NO_CKPT}x)", flush=True)  # fmt: skip
    if ratios.get("ray") is not None:
        print(f"         ray.train V2 same ratio: {ratios['ray']:.2f}x (reference; its fit() "
              "takes one report per controller poll, which dominates both runs)")  # fmt: skip


# ----------------------------------------------------------------------------------
def make_checkpoint(root: str) -> None:
    os.makedirs(root)
    for i in range(NUM_FILES):
        with open(os.path.join(root, f"shard_{i:02d}.bin"), "wb") as f:
            f.write(os.urandom(FILE_MIB * MIB))
    for name in os.listdir(root):  # read once: every side reads from the page cache
        with open(os.path.join(root, name), "rb") as f:
            while f.read(8 * MIB):
                pass


def torch_steps_per_s() -> float:
    import torch

    torch.set_num_threads(1)
    a = torch.ones(256, 256) / 256
    t = time.perf_counter()
    for _ in range(200):
        a = torch.tanh(a @ a)
    return 200 / (time.perf_counter() - t)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed reports per stall run")
    parser.add_argument("--run-reps", type=int, default=2, help="lumos runs per variant in (2)")
    parser.add_argument("--quick", action="store_true", help="reps 2, 1 run each, no S3")
    parser.add_argument("--skip-ray", action="store_true", help="lumos only")
    parser.add_argument("--skip-s3", action="store_true", help="local disk only")
    parser.add_argument("--work", choices=["sleep", "torch"], default="sleep",
                        help="the ~0.3 s of training in (2)")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.reps, args.run_reps, args.skip_s3 = 2, 1, True
    args.torch_steps_per_s = torch_steps_per_s() if args.work == "torch" else 0.0
    work = tempfile.mkdtemp(prefix="lumos-bench-ckpt-")
    src, empty = os.path.join(work, "src"), os.path.join(work, "empty")
    make_checkpoint(src)
    os.makedirs(empty)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    print(f"bench_checkpoint: 2 CPU workers, {NUM_FILES} x {FILE_MIB} MiB, reps={args.reps}, "
          f"cores={os.cpu_count()}, load avg={os.getloadavg()[0]:.1f}; lumos ASYNC available: "
          f"{LUMOS_HAS_ASYNC}", flush=True)  # fmt: skip
    t0 = time.time()
    try:
        local = LocalTarget(work)
        stall_section(local, args, src, empty, work)
        if not args.skip_s3:
            from lumos.storage.testing import s3_server

            with s3_server() as server:
                stall_section(S3Target(server), args, src, empty, work)
        run_section(local, args, src, empty, work)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbench_checkpoint: done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
