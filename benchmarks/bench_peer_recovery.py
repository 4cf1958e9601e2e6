"""Peer recovery (``TorchftConfig``) against checkpoint-restart and Ray, in the same run.

4 replicas, gloo on CPU, a fixed step time (``--step-s``), every rank reads the same batch
of a step (so a fault-free run's weights are known); one replica SIGKILLs itself at
fixed steps, several times (``KILLS``). Arms:

* ``lumos torchft``: ``TorchTrainer(torch_config=TorchftConfig())`` + ``prepare_torchft``:
  the survivors keep training, the dead rank is replaced (standby first) and takes the
  state from a live peer.
* ``lumos ckpt-restart``: the default path, ``TorchConfig`` + DDP, a checkpoint every
  ``CKPT_EVERY`` steps: every rank restarts from the latest committed checkpoint.
* ``ray torchft``: Ray Train V2 ``TorchftConfig`` with the same loop (torchft ``Manager``
  built by the function, as Ray's example does); when it does not run here, Ray's
  checkpoint-restart with the same loop instead (the reason is printed).

Figures per arm (medians over the kills): steps the survivors computed again per failure
(goal 0-1; checkpoint-restart: the steps since the last checkpoint), seconds from the
SIGKILL to the replacement's first committed step (goal <= 1 s with a standby), the
survivors' progress in the ``WINDOW_S`` seconds after a kill relative to the
``WINDOW_S`` seconds before it (goal >= 70%), and the largest difference of the final weights from checkpoint-
restart's (a deterministic replay of the fault-free run).

Run: ``RAY_TRAIN_V2_ENABLED=1 GLOO_SOCKET_IFNAME=lo python benchmarks/bench_peer_recovery.py``
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

WORKERS = 4
STEPS = 900
KILLS = [(1, 170), (2, 480), (3, 790)]
"""Far enough apart that the standby, respawned 5 s after a takeover, is warm again (it
imports torch, torch._dynamo and torchft: 10-20 s on a loaded 2-core host)."""
CKPT_EVERY = 50
WINDOW_S = 3.0
GOAL_RECOMPUTED = 1
GOAL_REPLACE_S = 1.0
GOAL_THROUGHPUT = 0.7


# -- shared by every arm's training function (shipped by value: this file is __main__) ------
def _log(config: dict[str, Any], rank: int, **event: Any) -> None:
    event.update(rank=rank, t=time.time())
    with open(Path(config["log_dir"]) / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _maybe_die(config: dict[str, Any], rank: int, step: int) -> None:
    for i, (kill_rank, kill_step) in enumerate(config["kills"]):
        marker = Path(config["log_dir"]) / f"killed-{i}"
        if rank == kill_rank and step >= kill_step and not marker.exists():
            marker.write_text("1")
            _log(config, rank, event="sigkill", step=step)
            os.kill(os.getpid(), signal.SIGKILL)


def _model() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _ft_loop(config: dict[str, Any], rank: int, model: Any, ft: Any, report: Any) -> None:
    """The torchft loop: quorum at zero_grad, batch of the committed step count."""
    import torch

    while ft.step < config["steps"]:
        ft.zero_grad()
        step = ft.step
        x, y = _batch(step)
        torch.nn.functional.mse_loss(ft.model(x), y).backward()
        time.sleep(config["step_s"])
        ok = ft.commit()
        _log(config, rank, event="step", step=step, ok=ok, n=ft.participants())
        if ok and report is not None and ft.step % 50 == 0:
            report({"step": ft.step})
        _maybe_die(config, rank, ft.step)
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    _log(config, rank, event="done", weights=weights)


class _LumosFt:
    def __init__(self, training: Any) -> None:
        self.t = training
        self.model = training.model

    @property
    def step(self) -> int:
        return int(self.t.step)

    def zero_grad(self) -> None:
        self.t.optimizer.zero_grad()

    def commit(self) -> bool:
        self.t.optimizer.step()
        return bool(self.t.committed)

    def participants(self) -> int:
        return int(self.t.participants())


def lumos_ft(config: dict[str, Any]) -> None:
    from lumos import train
    from lumos.train.torch import prepare_torchft

    rank = train.get_context().get_world_rank()
    model, optimizer = _model()
    ft = _LumosFt(prepare_torchft(model, optimizer))
    _ft_loop(config, rank, model, ft, train.report)


class _RayFt:
    """The same loop on a torchft Manager built by hand (Ray's torchft example)."""

    def __init__(self, rank: int, model: Any, optimizer: Any, timeout_s: float) -> None:
        from datetime import timedelta

        import torchft

        def load(state: dict[str, Any]) -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])

        def save() -> dict[str, Any]:
            return {"model": model.state_dict(), "optim": optimizer.state_dict()}

        timeout = timedelta(seconds=timeout_s)
        self.manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(timeout=timeout),
            min_replica_size=1,
            load_state_dict=load,
            state_dict=save,
            use_async_quorum=False,
            world_size=1,
            rank=0,
            replica_id=f"ray_bench_{rank}",
            timeout=timeout,
        )
        self.model = torchft.DistributedDataParallel(self.manager, model)
        self.optimizer = torchft.Optimizer(self.manager, optimizer)

    @property
    def step(self) -> int:
        return int(self.manager.current_step())

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def commit(self) -> bool:
        before = self.step
        self.optimizer.step()
        return self.step > before

    def participants(self) -> int:
        return int(self.manager.num_participants())


def ray_ft(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    model, optimizer = _model()
    ft = _RayFt(rank, model, optimizer, 30.0)
    try:
        _ft_loop(config, rank, model, ft, None)  # Ray: no report with a replica missing
    finally:
        ft.manager.shutdown(wait=False)


def ckpt_restart(config: dict[str, Any]) -> None:
    """DDP, a checkpoint every ``CKPT_EVERY`` steps; ``config["api"]``: lumos.train / ray.train."""
    import torch
    import torch.distributed as dist

    api = importlib.import_module(config["api"])
    rank = api.get_context().get_world_rank()
    model, optimizer = _model()
    start = 0
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(Path(d) / "state.pt")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = state["step"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for step in range(start, config["steps"]):
        optimizer.zero_grad()
        x, y = _batch(step)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        time.sleep(config["step_s"])
        optimizer.step()
        _log(config, rank, event="step", step=step, ok=True, n=dist.get_world_size())
        if (step + 1) % CKPT_EVERY == 0:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
                    torch.save({**state, "step": step + 1}, Path(d) / "state.pt")
                api.report({"step": step + 1}, checkpoint=api.Checkpoint.from_directory(d))
        _maybe_die(config, rank, step + 1)
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    _log(config, rank, event="done", weights=weights)


# -- figures --------------------------------------------------------------------------------
def _read(log_dir: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(log_dir.glob("rank*.jsonl")):
        out[int(path.stem[4:])] = [json.loads(x) for x in path.read_text().splitlines() if x]
    return out


def figures(log_dir: Path, steps: int) -> dict[str, Any]:
    """Recomputed steps, kill-to-stepping seconds and survivors' progress, per kill.

    Recomputed: the survivor's step executions beyond one per committed step index (a
    step torchft did not commit, or the steps a restart replays). Progress: the steps the
    survivor committed in the ``WINDOW_S`` seconds after a kill over those in the
    ``WINDOW_S`` seconds before it (the fault-free rate of that moment: the host's load
    drifts).
    """
    log = _read(log_dir)
    kills = sorted(
        (e["t"], r, e["step"]) for r, ev in log.items() for e in ev if e["event"] == "sigkill"
    )
    survivor = next(r for r in range(WORKERS) if r not in {k[1] for k in kills})
    steps_of = [e for e in log[survivor] if e["event"] == "step"]
    committed = {e["step"] for e in steps_of if e["ok"]}
    recomputed = (len(steps_of) - len(committed)) / len(kills)
    replace_s, progress = [], []
    for t, rank, _ in kills:
        back = [e["t"] for e in log[rank] if e["event"] == "step" and e["ok"] and e["t"] > t]
        replace_s.append((back[0] - t) if back else float("inf"))
        reached = [(e["t"], e["step"]) for e in steps_of if e["ok"]]
        at = max([s for u, s in reached if u <= t], default=0)
        before = at - max([s for u, s in reached if u <= t - WINDOW_S], default=0)
        after = max([s for u, s in reached if u <= t + WINDOW_S], default=0) - at
        progress.append(max(0, after) / max(1, before))
    ok = [e for e in steps_of if e["ok"]]
    finals = [ev[-1]["weights"] for ev in log.values() if ev and ev[-1]["event"] == "done"]
    return {
        "recomputed": recomputed,
        "replace_s": statistics.median(replace_s),
        "replace_each": [round(x, 2) for x in replace_s],
        "throughput": statistics.median(progress),
        "rate": (len(ok) - 1) / max(1e-9, ok[-1]["t"] - ok[0]["t"]),
        "weights": finals[0] if finals else None,
        "replicas_equal": all(f == finals[0] for f in finals),
    }


# -- arms -----------------------------------------------------------------------------------
def _config(root: Path, name: str, step_s: float, **extra: Any) -> dict[str, Any]:
    log_dir = root / f"{name}-log"
    log_dir.mkdir()
    return {"log_dir": str(log_dir), "steps": STEPS, "kills": KILLS, "step_s": step_s, **extra}


def run_lumos(root: Path, step_s: float, torchft: bool) -> dict[str, Any]:
    from lumos import train
    from lumos.train.torch import TorchConfig, TorchftConfig, TorchTrainer

    name = "lumos-ft" if torchft else "lumos-ckpt"
    config = _config(root, name, step_s, api="lumos.train")
    TorchTrainer(
        lumos_ft if torchft else ckpt_restart,
        train_loop_config=config,
        torch_config=TorchftConfig() if torchft else TorchConfig(),
        scaling_config=train.ScalingConfig(num_workers=WORKERS),
        run_config=train.RunConfig(
            name=name,
            storage_path=str(root),
            verbose=False,
            failure_config=train.FailureConfig(max_failures=len(KILLS)),
        ),
    ).fit()
    return figures(Path(config["log_dir"]), STEPS)


def run_ray(root: Path, step_s: float) -> tuple[str, dict[str, Any]]:
    import ray.train
    from ray.train.torch import TorchTrainer as RayTorchTrainer

    def fit(fn: Any, name: str, torch_config: Any, config: dict[str, Any]) -> dict[str, Any]:
        RayTorchTrainer(
            fn,
            train_loop_config=config,
            torch_config=torch_config,
            scaling_config=ray.train.ScalingConfig(num_workers=WORKERS),
            run_config=ray.train.RunConfig(
                storage_path=str(root),
                name=name,
                failure_config=ray.train.FailureConfig(max_failures=len(KILLS)),
            ),
        ).fit()
        return figures(Path(config["log_dir"]), STEPS)

    try:
        from ray.train.v2.torch.torchft_config import TorchftConfig as RayTorchftConfig

        from lumos.train.torch import TorchftConfig as LumosTorchftConfig

        lighthouse = LumosTorchftConfig().lighthouse_args()  # the same settings as lumos
        ft_config = RayTorchftConfig(lighthouse_kwargs=lighthouse, backend="gloo")
        return "ray torchft", fit(ray_ft, "ray-ft", ft_config, _config(root, "ray-ft", step_s))
    except Exception as exc:  # Ray's TorchftConfig did not run here: say why, fall back
        print(f"ray torchft did not run here ({type(exc).__name__}: {str(exc)[:300]}); "
              "Ray's checkpoint-restart instead")  # fmt: skip
        from ray.train.torch import TorchConfig as RayTorchConfig

        config = _config(root, "ray-ckpt", step_s, api="ray.train")
        return "ray ckpt-restart", fit(ckpt_restart, "ray-ckpt", RayTorchConfig(), config)


def _row(name: str, f: dict[str, Any], reference: list[float] | None) -> str:
    diff = "-"
    if reference is not None and f["weights"] is not None:
        diff = f"{max(abs(a - b) for a, b in zip(f['weights'], reference, strict=True)):.2e}"
    return (
        f"{name:<18} {f['recomputed']:>10.1f} {f['replace_s']:>10.2f} {f['throughput']:>10.0%} "
        f"{f['rate']:>8.1f} {diff:>10} {'yes' if f['replicas_equal'] else 'NO':>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-s", type=float, default=0.05, help="fixed time of one step")
    parser.add_argument("--skip-ray", action="store_true", help="no Ray Train arm")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=WORKERS + 1, include_dashboard=False, log_to_driver=False)
    root = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    results = {
        "lumos torchft": run_lumos(root, args.step_s, torchft=True),
        "lumos ckpt-restart": run_lumos(root, args.step_s, torchft=False),
    }
    if not args.skip_ray:
        name, figs = run_ray(root, args.step_s)
        results[name] = figs
    reference = results["lumos ckpt-restart"]["weights"]
    print(f"\n{WORKERS} replicas, gloo CPU, step {args.step_s} s, {STEPS} steps, SIGKILLs {KILLS}")
    print(f"{'arm':<18} {'recomputed':>10} {'kill->step':>10} {'progress':>10} {'steps/s':>8} "
          f"{'dw vs ckpt':>10} {'replicas':>8}")  # fmt: skip
    for name, f in results.items():
        print(_row(name, f, reference))
    for name, f in results.items():
        print(f"{name}: kill -> replacement stepping per kill (s): {f['replace_each']}")
    ft = results["lumos torchft"]
    ck = results["lumos ckpt-restart"]
    print(f"recomputed per failure: torchft {ft['recomputed']:.1f} (goal <= {GOAL_RECOMPUTED}) "
          f"vs ckpt-restart {ck['recomputed']:.1f}")  # fmt: skip
    print(f"kill -> replacement stepping: {ft['replace_s']:.2f} s (goal <= {GOAL_REPLACE_S} s)")
    print(f"survivors' progress in {WINDOW_S:.0f} s after a kill: {ft['throughput']:.0%} of the "
          f"fault-free rate (goal >= {GOAL_THROUGHPUT:.0%})")  # fmt: skip
    for name, f in results.items():
        if name != "lumos torchft" and f["replace_s"] > 0:
            print(f"ratio {name} / lumos torchft: kill->step {f['replace_s'] / ft['replace_s']:.1f}x, "
                  f"recomputed {f['recomputed'] - ft['recomputed']:+.1f} steps")  # fmt: skip
    ray.shutdown()


if __name__ == "__main__":
    main()
