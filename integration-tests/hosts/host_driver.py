"""A driver process of the hosts scenarios, run on a host of the harness.

It connects the way a user's script does (``ray.init(address="<head>:6379")``) and
stores on the moto S3 server of another host. The test runs it in a namespace
(``Host.popen`` / ``Host.run``), so it can SIGKILL it; it reads the driver's
progress from the events file and its outcome from the last stdout line.

    python host_driver.py fit CONFIG_JSON      one TorchTrainer.fit(); prints RESULT {...}
    python host_driver.py state CONFIG_JSON    the stored run state; prints RESULT {...}
    python host_driver.py lease CONFIG_JSON    try to take the run's lease; RESULT {...}

``CONFIG_JSON`` keys: ``address``, ``endpoint``, ``bucket``, ``name``, ``events``
(a JSON-lines file: one line per report rank 0 made), ``num_workers`` (an int or
``[min, max]``), ``train_loop_config``, ``max_failures``, ``placement_strategy``,
``resources_per_worker``, ``resize_interval_s``, ``torch_timeout_s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _storage(config: dict[str, Any]) -> tuple[str, Any]:
    from lumos.storage.testing import s3_filesystem

    return f"s3://{config['bucket']}/runs", s3_filesystem(config["endpoint"])


class _Events:
    """A ``train.Callback`` that appends each of rank 0's reports to the events file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
        row = {k: metrics.get(k) for k in ("step", "attempt", "world_size", "resumed_from")}
        row["nodes"] = sorted({r["node_ip"] for r in metrics.get("ranks", [])})
        row["checkpoint"] = checkpoint is not None
        row["t"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def fit(config: dict[str, Any]) -> dict[str, Any]:
    """One ``TorchTrainer.fit()`` on the hosts; its result as plain values."""
    import ray

    from lumos import train
    from lumos.train.torch import TorchConfig, TorchTrainer

    events = _Events(config["events"])
    callback = type("EventsCallback", (train.Callback,), {"on_report": events.on_report})()
    ray.init(
        address=config["address"],
        job_config=ray.job_config.JobConfig(code_search_path=[HERE]),
        log_to_driver=bool(config.get("log_to_driver", True)),
    )
    import host_workloads

    num_workers = config["num_workers"]
    storage_path, fs = _storage(config)
    started = time.time()
    result = TorchTrainer(
        getattr(host_workloads, config.get("workload", "ddp_sharded")),
        train_loop_config=config.get("train_loop_config", {}),
        torch_config=TorchConfig(timeout_s=float(config.get("torch_timeout_s", 1800.0))),
        scaling_config=train.ScalingConfig(
            num_workers=tuple(num_workers) if isinstance(num_workers, list) else num_workers,
            placement_strategy=config.get("placement_strategy", "SPREAD"),
            resources_per_worker=config.get("resources_per_worker"),
            elastic_resize_monitor_interval_s=float(config.get("resize_interval_s", 60.0)),
        ),
        run_config=train.RunConfig(
            name=config["name"],
            storage_path=storage_path,
            storage_filesystem=fs,
            failure_config=train.FailureConfig(max_failures=int(config.get("max_failures", 0))),
            callbacks=[callback],
            verbose=True,
        ),
    ).fit()
    return {
        "metrics": result.metrics,
        "steps": [row.get("step") for row in result.metrics_history],
        "error": repr(result.error) if result.error is not None else None,
        "fit_s": time.time() - started,
        "state": state(config),
    }


def state(config: dict[str, Any]) -> dict[str, Any]:
    """The stored run: status, attempts, committed checkpoints and their shard files."""
    from lumos.storage import RunStorage

    storage_path, fs = _storage(config)
    storage = RunStorage(storage_path, config["name"], fs)
    loaded = storage.load_state()
    if loaded is None:
        return {"status": None}
    names = loaded.checkpoint_names()
    root = f"{config['bucket']}/runs/{config['name']}"
    shards = {name: sorted(os.path.basename(p) for p in fs.ls(f"{root}/{name}")) for name in names}
    return {
        "status": loaded.status,
        "attempts": len(loaded.attempts),
        "checkpoints": names,
        "shards": shards,
        "uncommitted": storage.list_uncommitted(),
        "written": _shards_written(fs, root),
    }


def _shards_written(fs: Any, root: str) -> list[dict[str, Any]]:
    """Every shard file under the run (committed or not): its content and its S3 mtime."""
    out = []
    for path in fs.find(root):
        if os.path.basename(path).startswith("shard-"):
            record = json.loads(fs.cat_file(path))
            record["dir"] = path[len(root) + 1 :].split("/")[0]
            record["modified"] = fs.info(path)["LastModified"].timestamp()
            out.append(record)
    return out


def lease(config: dict[str, Any]) -> dict[str, Any]:
    """Try to take the run's lease, as a second driver's ``fit()`` does first."""
    from lumos.storage import RunStorage

    storage_path, fs = _storage(config)
    taken = RunStorage(storage_path, config["name"], fs).acquire_lease("second driver")
    taken.release()
    return {"acquired": True}


def main() -> int:
    command, config = sys.argv[1], json.loads(sys.argv[2])
    try:
        out = {"fit": fit, "state": state, "lease": lease}[command](config)
    except Exception as exc:  # the test asserts on it (e.g. a second driver refused)
        import traceback

        traceback.print_exc()
        out = {"raised": type(exc).__name__, "message": str(exc)}
    print("RESULT " + json.dumps(out, default=repr), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
