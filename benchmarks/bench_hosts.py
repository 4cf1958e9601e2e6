"""Real hosts (network namespaces, ``integration-tests/hosts``): lumos against Ray Train V2.

One cluster of hosts for the whole run: ``h0`` the Ray head, ``h1`` and ``h2`` Ray
workers (4 logical CPUs each), ``h3`` the drivers' host (a Ray node with 0 CPUs). Both
frameworks train the same loop (an all-reduce, then ``report``) from a driver on
``h3``, storing on a directory every host sees (the hosts share this machine's
filesystem, as with NFS). Measured:

  (a) fit start to first report, 3 workers on 3 hosts (``SPREAD``) and on one host
      (``STRICT_PACK``), ``--reps`` times each; medians.
  (b) host loss to training again: a fixed-size 3-worker ``SPREAD`` run, every
      process on ``h2`` killed after 5 reports; the time from the kill to the first
      report of the new attempt (``FailureConfig(max_failures=1)``).

Ray Train V2 has no interface choice of its own: on these hosts (hostname ->
127.0.1.1) its gloo group fails without ``GLOO_SOCKET_IFNAME``, so its runs get
``GLOO_SOCKET_IFNAME=eth1`` through the job's ``runtime_env``; lumos runs get nothing.
``--ray-unset`` also runs Ray Train once without it and prints the outcome.

Run as root (namespaces): ``RAY_USAGE_STATS_ENABLED=0 .venv/bin/python
benchmarks/bench_hosts.py [--reps 3] [--skip-ray] [--ray-unset]``. Minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration-tests" / "hosts"))

STORAGE = "/tmp/lumos-hosts/bench-storage"


# --- on the workers -------------------------------------------------------------------
def _loop(report: Any, rank: int, config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    launch = uuid.uuid4().hex[:8]
    step = 0
    while step < int(config["steps"]) or not os.path.exists(config.get("until") or "/"):
        step += 1
        dist.all_reduce(torch.ones(1))
        report({"t": time.time(), "step": step})
        if rank == 0 and config.get("marks"):
            with open(config["marks"], "a") as f:
                f.write(json.dumps({"t": time.time(), "launch": launch, "step": step}) + "\n")
        time.sleep(float(config.get("step_s", 0.0)))


def lumos_fn(config: dict[str, Any]) -> None:
    from lumos import train

    _loop(train.report, train.get_context().get_world_rank(), config)


def ray_fn(config: dict[str, Any]) -> None:
    import ray.train

    _loop(ray.train.report, ray.train.get_context().get_world_rank(), config)


# --- the driver, on h3 ----------------------------------------------------------------
def fit(framework: str, strategy: str, config: dict[str, Any], max_failures: int = 0) -> Any:
    """One fit; returns (first report time, fit start time) or the error text."""
    name = f"{framework}-{uuid.uuid4().hex[:8]}"
    started = time.time()
    if framework == "lumos":
        from lumos import train
        from lumos.train.torch import TorchTrainer

        result: Any = TorchTrainer(
            lumos_fn,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(num_workers=3, placement_strategy=strategy),
            run_config=train.RunConfig(
                name=name,
                storage_path=STORAGE,
                verbose=False,
                failure_config=train.FailureConfig(max_failures=max_failures),
            ),
        ).fit()
    else:
        import ray.train
        from ray.train.torch import TorchConfig, TorchTrainer

        result = TorchTrainer(
            ray_fn,
            train_loop_config=config,
            torch_config=TorchConfig(timeout_s=int(config.get("timeout_s", 1800))),
            scaling_config=ray.train.ScalingConfig(num_workers=3, placement_strategy=strategy),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=STORAGE,
                failure_config=ray.train.FailureConfig(max_failures=max_failures),
            ),
        ).fit()
    if result.error is not None:
        return _gist(repr(result.error))
    with open(config["marks"]) as f:  # rank 0's marks (Ray V2 keeps no metrics history)
        first = min(json.loads(line)["t"] for line in f if line.strip())
    return [first, started]


def _gist(text: str) -> str:
    """The line of an error that says what failed (gloo's connect error, when there is one)."""
    for line in text.splitlines():
        if "connectFullMesh" in line or "Connection refused" in line:
            return line.strip()[:400]
    return text[-400:]


def driver(args: dict[str, Any]) -> None:
    import ray

    env = {"GLOO_SOCKET_IFNAME": "eth1"} if args.get("ray_ifname") else {}
    ray.init(address=args["address"], runtime_env={"env_vars": env}, log_to_driver=False)
    out: Any
    try:
        out = fit(args["framework"], args["strategy"], args["config"], args.get("max_failures", 0))
    except Exception as exc:
        out = f"{type(exc).__name__}: {_gist(str(exc))}"
    print("RESULT " + json.dumps(out), flush=True)


# --- the orchestrator, outside the hosts -----------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--ray-unset", action="store_true")
    args = parser.parse_args()
    from host_cluster import result_line
    from hosts import STATE_DIR, Hosts

    frameworks = ["lumos"] if args.skip_ray else ["lumos", "ray"]
    with Hosts(4) as hosts:
        address = hosts.ray_head(hosts[0], num_cpus=4)
        for i, cpus in ((1, 4), (2, 4), (3, 0)):
            hosts.ray_join(hosts[i], address, num_cpus=cpus)
        os.makedirs(STORAGE, exist_ok=True)

        def run(
            framework: str, strategy: str, config: dict[str, Any], ifname: bool = True, **extra: Any
        ) -> Any:
            spec = {"address": address, "framework": framework, "strategy": strategy}
            spec.update(config=config, ray_ifname=ifname and framework == "ray", **extra)
            env = {"RAY_TRAIN_V2_ENABLED": "1"}
            log = STATE_DIR / f"bench-{uuid.uuid4().hex[:6]}.log"
            proc = hosts[3].popen(
                [sys.executable, __file__, "--driver", json.dumps(spec)], log, env
            )
            return proc, log, lambda: result_line(log.read_text(errors="replace"))

        def once(framework: str, strategy: str, config: dict[str, Any], ifname: bool = True) -> Any:
            marks = STATE_DIR / f"marks-{uuid.uuid4().hex[:8]}.jsonl"
            proc, _, result = run(framework, strategy, dict(config, marks=str(marks)), ifname)
            proc.wait(900)
            return result()

        print("(a) fit start to first report, 3 workers (median of", args.reps, "runs)")
        for framework in frameworks:
            for strategy, where in (("SPREAD", "3 hosts"), ("STRICT_PACK", "1 host")):
                times = []
                for _ in range(args.reps):
                    out = once(framework, strategy, {"steps": 1})
                    if isinstance(out, str):
                        print(f"    {framework} {where}: failed: {out}")
                        break
                    times.append(out[0] - out[1])
                if times:
                    print(
                        f"    {framework:5s} {where:7s}: {statistics.median(times):6.2f} s  {times}"
                    )
        if args.ray_unset and not args.skip_ray:
            out = once("ray", "SPREAD", {"steps": 1, "timeout_s": 60}, ifname=False)
            print(f"    ray without GLOO_SOCKET_IFNAME on 3 hosts: {out}")

        print("(b) host loss to training again (3 workers SPREAD, every process on h2 killed)")
        for framework in frameworks:
            marks = STATE_DIR / f"marks-{framework}.jsonl"
            until = STATE_DIR / f"until-{framework}"
            config = {"steps": 5, "step_s": 0.3, "marks": str(marks), "until": str(until)}
            proc, log, _ = run(framework, "SPREAD", config, max_failures=1)

            def rows() -> list[dict[str, Any]]:
                text = marks.read_text() if marks.exists() else ""
                return [json.loads(line) for line in text.splitlines() if line]

            deadline = time.time() + 300
            while len(rows()) < 5 and time.time() < deadline and proc.poll() is None:
                time.sleep(0.2)
            first_launch = rows()[0]["launch"] if rows() else None
            hosts[2].kill_all()
            killed = time.time()
            while time.time() < deadline + 300 and proc.poll() is None:
                again = [r for r in rows() if r["launch"] != first_launch]
                if again:
                    print(f"    {framework:5s}: {again[0]['t'] - killed:6.2f} s")
                    break
                time.sleep(0.2)
            else:
                print(f"    {framework}: never trained again: {log.read_text()[-1500:]}")
            until.touch()
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                print(f"    {framework}: driver did not end")
            hosts[2].boot()
            hosts.ray_join(hosts[2], address, num_cpus=4)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--driver":
        driver(json.loads(sys.argv[2]))
    else:
        main()
