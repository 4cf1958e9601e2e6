"""The soak's settings, its log line and its jobs (shared by the harness, the faults and the checks)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "soak_driver.py"
NODES = 3
CPUS_PER_NODE = 4
TRAIN_STEPS = 40
STEP_S = 0.25
CKPT_EVERY = 2
VALIDATE_EVERY = 4
NUM_TO_KEEP = 3
SHARD_FLOATS = 256 * 1024  # 1 MiB per shard: uploads take a moment
#: S3 Train runs: 11 MiB shards, over twice the soak filesystem's 5 MiB part size, so
#: each shard goes up as a multipart upload (3 parts) and an S3 restart can cut one.
S3_SHARD_FLOATS = 11 * 256 * 1024
#: Each validation takes this much longer (a driver can be killed while one runs).
VALIDATE_S = 1.0
SWEEP_SAMPLES = 4
SWEEP_STEPS = 8
FAULT_GAP_S = (6.0, 14.0)
RERUN_DELAY_S = 1.0
MAX_UNEXPECTED_EXITS = 3
RETRY_FAULT_S = 2.0
#: FailureConfig(health_check_timeout_s) of every run: generous, the 2-core machine is shared.
HEALTH_CHECK_TIMEOUT_S = 20.0
#: FailureConfig(hang_timeout_s) of every run: the hang watchdog's timeout; a
#: user_thread_stall sleeps 3-7 s (must not fire it) or this + 10 s (must fire it once).
HANG_TIMEOUT_S = 30.0
DRAIN_DEADLINE_S = 15.0
#: After the schedule ends (at 80% of --minutes), how long the last jobs may take to finish.
FINISH_GRACE_S = 480.0
RETRY_FAULT_TRIES = 10
#: The lease a Train driver holds (``RunStorage.acquire_lease``'s default ttl_s).
LEASE_TTL_S = 30.0
#: A full disk must make the run fail within this long (ENOSPC is permanent).
DISK_FULL_FAIL_S = 120.0
#: The size of the tmpfs a local Train run of an even round writes to.
DISK_SIZE = "256m"
#: After SIGCONT, how long a driver whose lease was taken over may go on before it is killed.
STALE_DRIVER_MAX_S = 60.0
#: How long a takeover (the second driver holding the lease) may take.
TAKEOVER_WAIT_S = 120.0
#: Watched faults: armed when drawn, counted when they hit (or skipped when the job ends).
WATCHED = (
    "kill_in_upload",
    "driver_kill_in_state_write",
    "driver_kill_after_training",
    "driver_kill_in_validation",
    "driver_kill_in_final_write",
    "s3_restart_in_multipart",
    "disk_full",  # waits for a local Train run on a tmpfs with 8 steps to go
)
#: How long a watched fault waits for its moment (the phase kills: until the job ends).
WATCH_S = {"kill_in_upload": 15.0, "driver_kill_in_state_write": 15.0}
WATCH_DEFAULT_S = 240.0
ALL_KINDS = [
    "worker_kill",
    "worker_hang",
    "driver_kill",
    "node_cycle",
    "kill_in_upload",
    "driver_kill_in_state_write",
    "preempt",
    "s3_restart",
    "storage_errors",
    "driver_kill_after_training",
    "driver_kill_in_validation",
    "driver_kill_in_final_write",
    "s3_restart_in_multipart",
    "driver_stall_past_lease",
    "disk_full",
    "user_thread_stall",
]
#: Seeds the repository runs (nox's default, the short test); ``--seeds`` never draws them.
BUILT_IN_SEEDS = frozenset({1, 3, 20261201})


def log(msg: str) -> None:
    """One line of the harness's own output."""
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def add_node(cluster: Any, tries: int = 3) -> Any:
    """A worker node of ``CPUS_PER_NODE`` CPUs. Retried: Ray waits a fixed 30 s for a new
    raylet to register with the GCS, which a loaded machine can take longer than (a
    seed's start failed so at load 37)."""
    for attempt in range(tries):
        try:
            return cluster.add_node(num_cpus=CPUS_PER_NODE)
        except Exception as exc:
            if attempt == tries - 1:
                raise
            log(f"adding a node failed ({exc}); trying again")
            time.sleep(5.0)
    return None


@dataclass
class Exit:
    """One driver process that ended: which start, its status, its log, and why."""

    start: int
    rc: int
    log_path: Path
    #: "ok" | "killed by the soak" | "planned: disk full" | "unexpected" | "stale" (a driver
    #: whose lease was taken over) | "killed at the hard deadline"
    why: str


@dataclass
class Job:
    """One workload (a Train run or a sweep) and its driver processes."""

    kind: str  # "train" | "sweep"
    name: str
    storage: str  # "local" | "s3"
    spec: dict[str, Any]
    cmd: list[str]
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    killed_by_us: bool = False
    done: bool = False
    result: dict[str, Any] | None = None
    exits: list[Exit] = field(default_factory=list)
    rerun_at: float | None = None
    #: The fault that owns the driver now (no other fault targets the driver meanwhile).
    held_by: str | None = None
    #: A small disk (tmpfs) under this run's storage, or None.
    disk: Any = None
    #: What a disk_full fault saw (see soak_faults.py).
    disk_full: dict[str, Any] | None = None
    #: What a driver_stall_past_lease takeover saw.
    takeover: dict[str, Any] | None = None
    #: start number -> the driver's pid and Ray job id (its ``DRIVER`` line).
    drivers: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        """The log of the current (or last) driver start."""
        return self.log_at(max(self.starts, 1))

    def log_at(self, start: int) -> Path:
        """The log of driver start ``start`` (1, 2, ...)."""
        return self.log_dir / f"start-{start}.log"

    @property
    def unexpected_exits(self) -> list[Exit]:
        """Exits that are neither the harness's kills nor planned failures."""
        return [e for e in self.exits if e.why == "unexpected"]

    def runs(self, ledger_dir: Path) -> list[str]:
        """Train run names whose worker markers belong to this job."""
        if self.kind == "train":
            return [self.name]
        root = ledger_dir / "markers"
        if not root.exists():
            return []
        return [p.name for p in root.iterdir() if p.name.startswith(f"{self.name}-")]

    def driver_info(self, start: int) -> dict[str, Any]:
        """The ``DRIVER {...}`` line of a start's log (pid, Ray job id), read once seen."""
        if start not in self.drivers:
            path = self.log_at(start)
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    if line.startswith("DRIVER "):
                        self.drivers[start] = dict(json.loads(line[len("DRIVER ") :]))
                        break
        return self.drivers.get(start, {})


def log_tail(path: Path, lines: int = 12) -> list[str]:
    """The last ``lines`` lines of a log (for evidence)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return [f"(cannot read {path}: {exc})"]
    return [line for line in text.splitlines() if line.strip()][-lines:]


def result_of(log_path: Path) -> dict[str, Any] | None:
    """The ``RESULT {...}`` line a driver prints on success."""
    if not log_path.exists():
        return None
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return None
