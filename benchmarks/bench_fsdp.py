"""FSDP2 + DCP sharded checkpoints: lumos.train against ray.train V2 (2.58), same run.

Issue 28. A model of Linear(W, W) layers (``--layers``; default 6 x 2048^2, 25 M
parameters: 100 MiB of parameters + 200 MiB of Adam state = 300 MiB) sharded with FSDP2
over 2 gloo ranks on the CPU; checkpoints to local disk.

  (1) training-thread stall per checkpoint (rank 0, ``perf_counter`` around save +
      ``report()``): lumos ``save_sharded_state`` + ``report(SYNC)`` against
      ``save_sharded_state(async_save=True)`` + ``report(ASYNC)`` (DCP's checkpoint
      process). Goal: async <= 0.2x sync. Ray V2's documented way (``dcp.save`` into a
      temporary directory, then ``ray.train.report(checkpoint=...)`` on every rank,
      SYNC and ASYNC upload modes) in the same run.
  (2) steps/s with an async checkpoint every k steps against none (same run, same
      steps). Goal: time ratio <= 1.1x.
  (3) peak RSS and PSS (each rank's process plus its children, i.e. DCP's checkpoint
      process) during the checkpoint phases against training alone. RSS counts the
      staging buffers that the rank and its checkpoint process share twice; PSS once.
  (4) reshard-resume 4 -> 2: a 4-rank lumos run saves, then a 2-rank lumos run and a
      2-rank Ray run each resume from that DCP checkpoint; time from the training
      function's start to the state loaded (rank 0), and fit() start to loaded.

Run: ``RAY_TRAIN_V2_ENABLED=1 python benchmarks/bench_fsdp.py [--quick] [--skip-ray]``
(``--quick``: 2 layers of 1024, fewer reps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from lumos import train
from lumos.train.torch import TorchTrainer

MIB = 1024 * 1024


def _model(cfg: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(0)
    w = cfg["width"]
    return torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(cfg["layers"])])


def _shard(model: Any, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _step(model: Any, opt: Any, cfg: dict[str, Any]) -> None:
    import torch

    x = torch.randn(cfg["batch"], cfg["width"])
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


class RssSampler:
    """Peak memory of this process plus its children, per phase: RSS every 20 ms, PSS
    every 100 ms. RSS counts a shared page once per process that maps it: DCP's staging
    buffers (shared memory) are mapped by the rank and by its checkpoint process, so their
    RSS sum counts them twice; PSS splits each shared page between the processes."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peaks: dict[str, int] = {}
        self.pss_peaks: dict[str, int] = {}
        self.phase = "idle"
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _sum(self, pss: bool) -> int:
        total = 0
        for proc in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += proc.memory_full_info().pss if pss else proc.memory_info().rss
            except Exception:  # gone meanwhile
                pass
        return total

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.02):
            phase, n = self.phase, n + 1
            self.peaks[phase] = max(self.peaks.get(phase, 0), self._sum(pss=False))
            if n % 5 == 0:
                self.pss_peaks[phase] = max(self.pss_peaks.get(phase, 0), self._sum(pss=True))

    def stop(self) -> None:
        self._stop.set()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by this process and its children."""
        total = 0.0
        for proc in [self._proc, *self._proc.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except Exception:  # gone meanwhile
                pass
        return total


def _timed_phases(
    cfg: dict[str, Any], model: Any, opt: Any, checkpoint: Callable[[str, int], None], rank: int
) -> dict[str, Any]:
    """The measured loop shared by both frameworks; ``checkpoint(mode, step)`` saves."""
    rss = RssSampler()
    out: dict[str, Any] = {}
    rss.phase = "train"
    for _ in range(2):  # warm-up
        _step(model, opt, cfg)
    t0, c0 = time.perf_counter(), rss.cpu_s()
    for _ in range(cfg["steps"]):
        _step(model, opt, cfg)
    out["train_only_s"] = time.perf_counter() - t0
    out["train_only_cpu_s"] = rss.cpu_s() - c0
    step = 0
    for mode in cfg["modes"]:
        rss.phase = mode
        stalls = []
        for i in range(cfg["reps"] + 1):  # the first is a warm-up
            for _ in range(cfg["between"]):
                _step(model, opt, cfg)
            t = time.perf_counter()
            checkpoint(mode, step)
            if i:
                stalls.append(time.perf_counter() - t)
            step += 1
        out[f"stall_{mode}"] = stalls
    if "lumos_async" in cfg["modes"] or "ray_async" in cfg["modes"]:
        mode = cfg["modes"][-1]
        rss.phase = f"{mode}_every_k"
        t0, c0 = time.perf_counter(), rss.cpu_s()
        for s in range(cfg["steps"]):
            _step(model, opt, cfg)
            if (s + 1) % cfg["every"] == 0:
                checkpoint(mode, step)
                step += 1
        out["every_k_s"] = time.perf_counter() - t0
        out["every_k_cpu_s"] = rss.cpu_s() - c0
        # The first baseline can still be warming up: time it again once the last save's
        # background work is done, and compare with the faster of the two.
        rss.phase = "train_again"
        time.sleep(cfg["settle_s"])
        t0, c0 = time.perf_counter(), rss.cpu_s()
        for _ in range(cfg["steps"]):
            _step(model, opt, cfg)
        out["train_only_again_s"] = time.perf_counter() - t0
        out["train_only_again_cpu_s"] = rss.cpu_s() - c0
    rss.stop()
    out["floor_cpu_s"] = _write_floor_cpu_s(model, opt)
    out["rss_peak_mib"] = {k: v / MIB for k, v in rss.peaks.items()}
    out["pss_peak_mib"] = {k: v / MIB for k, v in rss.pss_peaks.items()}
    return out


def _write_floor_cpu_s(model: Any, opt: Any) -> float:
    """CPU seconds this thread spends writing this rank's shard bytes (model + Adam state)
    to one new local file with ``write`` + ``fsync``: the least any checkpoint of this
    state costs here, whoever writes it. Median of 3."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.utils._pytree import tree_leaves

    tensors = [
        t.to_local() if hasattr(t, "to_local") else t
        for t in tree_leaves(get_state_dict(model, opt))
        if isinstance(t, torch.Tensor)
    ]
    costs = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.thread_time()
            with open(os.path.join(d, "shard"), "wb") as f:
                for t in tensors:
                    f.write(memoryview(t.detach().contiguous().numpy()).cast("B"))
                f.flush()
                os.fsync(f.fileno())
            costs.append(time.thread_time() - t0)
    return statistics.median(costs)


def lumos_fn(cfg: dict[str, Any]) -> None:
    import torch

    from lumos.train.torch import load_sharded_state, prepare_model, save_sharded_state

    t_start = time.time()
    rank = train.get_context().get_world_rank()
    model = prepare_model(_model(cfg), parallel_strategy="fsdp")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    out: dict[str, Any] = {"t_fn_start": t_start}
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        t = time.perf_counter()
        load_sharded_state(ckpt, model, opt)
        out["load_s"] = time.perf_counter() - t
        out["t_loaded"] = time.time()

    def checkpoint(mode: str, step: int) -> None:
        asynchronous = mode == "lumos_async"
        c = save_sharded_state(
            tempfile.mkdtemp(),
            model,
            opt,
            async_save=asynchronous,
            async_checkpointer_type=cfg["async_type"],
        )
        upload = train.CheckpointUploadMode.ASYNC if asynchronous else None
        train.report(
            {"step": step},
            checkpoint=c,
            checkpoint_upload_mode=upload or train.CheckpointUploadMode.SYNC,
        )

    if cfg["modes"]:
        out.update(_timed_phases(cfg, model, opt, checkpoint, rank))
    elif cfg.get("save_once"):
        checkpoint("lumos_sync", 0)
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump(out, f)


def ray_fn(cfg: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    t_start = time.time()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = _shard(_model(cfg), world)  # Ray's FSDP2 docs: fully_shard by hand
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    out: dict[str, Any] = {"t_fn_start": t_start}
    ckpt = ray.train.get_checkpoint()  # V2 refuses resume_from_checkpoint: its migration
    if ckpt is None and cfg.get("resume"):  # guide passes the path in the loop config
        ckpt = ray.train.Checkpoint(cfg["resume"])
    if ckpt is not None:
        t = time.perf_counter()
        with ckpt.as_directory() as d:
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=d)
            set_state_dict(
                model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        out["load_s"] = time.perf_counter() - t
        out["t_loaded"] = time.time()

    def checkpoint(mode: str, step: int) -> None:
        d = tempfile.mkdtemp()
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=d)
        upload = ray.train.CheckpointUploadMode
        ray.train.report(
            {"step": step},
            checkpoint=ray.train.Checkpoint.from_directory(d),
            checkpoint_upload_mode=upload.ASYNC if mode == "ray_async" else upload.SYNC,
        )

    if cfg["modes"]:
        out.update(_timed_phases(cfg, model, opt, checkpoint, rank))
    if rank == 0:
        with open(cfg["out"], "w") as f:
            json.dump(out, f)


def _run(framework: str, cfg: dict[str, Any], workers: int, root: str, name: str,
         resume: str | None = None) -> dict[str, Any]:  # fmt: skip
    cfg = dict(cfg, out=os.path.join(root, f"{name}.json"), resume=resume)
    os.sync()
    t0 = time.time()
    if framework == "lumos":
        TorchTrainer(
            lumos_fn,
            train_loop_config=cfg,
            scaling_config=train.ScalingConfig(num_workers=workers),
            run_config=train.RunConfig(
                name=name,
                storage_path=root,
                verbose=False,
                checkpoint_config=train.CheckpointConfig(num_to_keep=2),
            ),
            resume_from_checkpoint=None
            if resume is None
            else train.Checkpoint.from_directory(resume),
        ).fit()
    else:
        import ray.train
        from ray.train.torch import TorchTrainer as RayTorchTrainer

        RayTorchTrainer(
            ray_fn,
            train_loop_config=cfg,
            scaling_config=ray.train.ScalingConfig(num_workers=workers),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=root,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            ),
        ).fit()
    with open(cfg["out"]) as f:
        res: dict[str, Any] = json.load(f)
    res["t_fit_start"] = t0
    return res


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _print_run(label: str, res: dict[str, Any], sync: str, asyn: str) -> None:
    s, a = _med(res[f"stall_{sync}"]), _med(res[f"stall_{asyn}"])
    print(f"  {label}: stall per checkpoint  sync {s:.3f} s   async {a:.3f} s   "
          f"async/sync {a / s:.3f}x", flush=True)  # fmt: skip
    base = min(res["train_only_s"], res.get("train_only_again_s", float("inf")))
    ratio = res["every_k_s"] / base
    print(f"  {label}: {res['steps']} steps, async checkpoint every {res['every']}: "
          f"{res['every_k_s']:.2f} s vs {base:.2f} s without (faster of "
          f"{res['train_only_s']:.2f} s before and {res.get('train_only_again_s', 0):.2f} s "
          f"after): {ratio:.3f}x", flush=True)  # fmt: skip
    cpu_base = min(res["train_only_cpu_s"], res.get("train_only_again_cpu_s", float("inf")))
    print(f"  {label}: rank 0 CPU (process + children) in those windows: {res['every_k_cpu_s']:.2f} s "
          f"vs {cpu_base:.2f} s = {res['every_k_cpu_s'] / cpu_base:.3f}x (less sensitive to other "
          "load than the wall time)", flush=True)  # fmt: skip
    if "floor_cpu_s" in res:  # each rank trains on a core of its own: its CPU is its wall
        n_ckpt = res["steps"] // res["every"]
        floor = (base + n_ckpt * res["floor_cpu_s"]) / base
        print(f"  {label}: floor: writing rank 0's shard bytes once (write + fsync, no "
              f"serialization) costs {res['floor_cpu_s']:.3f} CPU-s; {n_ckpt} of them in "
              f"that window, with no core to spare, take it to at least {floor:.3f}x", flush=True)  # fmt: skip
    for kind in ("RSS", "PSS"):
        peaks = res[f"{kind.lower()}_peak_mib"]
        base = peaks.get("train", float("nan"))  # (train_again: the checkpoint process lives on)
        text = "  ".join(
            f"{k} {v:.0f} MiB ({v / base:.2f}x)"
            for k, v in peaks.items()
            if k not in ("idle", "train_again")
        )
        print(f"  {label}: rank 0 peak {kind} (process + children): {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--async-type", choices=["process", "thread"], default="process",
                        help="lumos's async_checkpointer_type")  # fmt: skip
    parser.add_argument("--every", type=int, default=None,
                        help="checkpoint every k steps in the steps/s window (default 5)")  # fmt: skip
    args = parser.parse_args()
    layers, width = (2, 1024) if args.quick else (args.layers, args.width)
    reps, steps, every = (2, 8, 4) if args.quick else (3, 20, 5)
    if args.every:
        every, steps = args.every, max(steps, 4 * args.every)
    cfg: dict[str, Any] = {"layers": layers, "width": width, "batch": 8, "reps": reps,
                           "steps": steps, "every": every, "between": 2,
                           "settle_s": 5.0, "async_type": args.async_type}  # fmt: skip
    n = layers * (width * width + width)
    print(f"bench_fsdp: {layers} x Linear({width}, {width}): {n / 1e6:.1f} M params, "
          f"{n * 4 / MIB:.0f} MiB params + {2 * n * 4 / MIB:.0f} MiB Adam state; "
          "2 gloo ranks, CPU, local disk", flush=True)  # fmt: skip
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    root = tempfile.mkdtemp(prefix="bench-fsdp-")
    res = _run("lumos", dict(cfg, modes=["lumos_sync", "lumos_async"]), 2, root, "lumos-stall")
    res.update(steps=steps, every=every)
    _print_run("lumos", res, "lumos_sync", "lumos_async")
    ray_res = None
    if not args.skip_ray:
        ray_res = _run("ray", dict(cfg, modes=["ray_sync", "ray_async"]), 2, root, "ray-stall")
        ray_res.update(steps=steps, every=every)
        _print_run("ray V2", ray_res, "ray_sync", "ray_async")
        lumos_a, ray_a = _med(res["stall_lumos_async"]), _med(ray_res["stall_ray_async"])
        print(
            f"  stall lumos async / ray V2 async: {lumos_a / ray_a:.3f}x; lumos sync / ray "
            f"sync: {_med(res['stall_lumos_sync']) / _med(ray_res['stall_ray_sync']):.3f}x"
        )
    _run("lumos", dict(cfg, modes=[], save_once=True), 4, root, "saved-on-4")
    saved = os.path.join(root, "saved-on-4")
    src = os.path.join(
        saved, sorted(p for p in os.listdir(saved) if p.startswith("checkpoint"))[-1]
    )
    for fw in ["lumos"] + ([] if args.skip_ray else ["ray"]):
        r = _run(fw, dict(cfg, modes=[]), 2, root, f"{fw}-resume-on-2", resume=src)
        print(f"  {fw}: reshard-resume 4 -> 2 ranks: load {r['load_s']:.2f} s; fit() start -> "
              f"state loaded {r['t_loaded'] - r['t_fit_start']:.2f} s", flush=True)  # fmt: skip
    ray.shutdown()


if __name__ == "__main__":
    main()
