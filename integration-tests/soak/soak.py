"""The chaos soak: Train runs and a Tune-over-Train sweep under seeded random faults.

    python integration-tests/soak/soak.py --minutes 5 --seed 7 [--storage local|s3|both]

The harness (this process) starts a simulated multi-node Ray cluster (a 0-CPU head
and 3 worker nodes), moto's S3 server on 127.0.0.1, and runs every workload as a
driver subprocess (``soak_driver.py``) connected to the cluster, so that a driver
can be SIGKILLed and started again with the same ``RunConfig``. A seeded fault
injector fires faults at random times (the schedule of kinds and gaps is a function
of the seed alone; the timing on the machine differs). When every workload finished,
the invariants are checked and printed, each PASS or FAIL, and the last line is

    faults injected: N (kind a, ...) · runs resumed: R · committed checkpoints lost: L · invariant violations: V

The exit status is non-zero on any violation; ``--seed`` reproduces the schedule.

Workloads per round (rounds start while there is time left):

* a Train run on each storage (local disk / moto S3): 2 workers, sharded
  checkpoints (each rank saves ``shard-<rank>.pt``), SYNC and ASYNC uploads (they
  swap between the storages every round), validation, ``max_failures=-1``;
* a Tune-over-Train sweep (ASHA pruning) on one storage, every other round
  (``--no-sweep`` leaves it out).

Faults: ``worker_kill`` (SIGKILL), ``worker_hang`` (SIGSTOP, then SIGCONT 3-7 s later,
within ``health_check_timeout_s=20``, or 25-29 s later, when the run must have
replaced the hung worker), ``driver_kill`` (SIGKILL, then the same command
again), ``node_cycle`` (remove a worker node, add one 3-8 s later),
``kill_in_upload`` (SIGKILL a worker that just started a checkpoint report),
``driver_kill_in_state_write`` (SIGKILL the driver when the run state changes:
its temp file appears or the file changes), ``preempt`` (a preemption notice:
SIGTERM to a worker, or a node drain whose node goes away at its deadline), ``s3_restart`` (the S3 server's HTTP front stops for 1-3 s;
moto keeps its objects in this process) and ``storage_errors`` (when
``lumos.storage.testing.FaultyFileSystem`` exists: S3 drivers started in the next
period see a fraction of writes, renames and listings fail).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
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
SWEEP_SAMPLES = 4
SWEEP_STEPS = 8
FAULT_GAP_S = (6.0, 14.0)
RERUN_DELAY_S = 1.0
MAX_UNEXPECTED_EXITS = 3
RETRY_FAULT_S = 2.0
#: FailureConfig(health_check_timeout_s) of every run: generous, the 2-core machine is shared.
HEALTH_CHECK_TIMEOUT_S = 20.0
DRAIN_DEADLINE_S = 15.0
#: After the schedule ends (at 80% of --minutes), how long the last jobs may take to finish.
FINISH_GRACE_S = 480.0
RETRY_FAULT_TRIES = 10

#: Faults that arm a watch and hit when the moment comes (or are skipped after 15 s).
WATCHED = ("kill_in_upload", "driver_kill_in_state_write")
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
]


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _has_faulty_fs() -> bool:
    try:
        from lumos.storage import testing

        return hasattr(testing, "FaultyFileSystem")
    except ImportError:
        return False


# -- the S3 server: moto keeps its objects in this process across restarts ------------------
class S3:
    """moto's S3 server on a fixed port; ``stop`` + ``start`` restart the HTTP front only."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._cls = ThreadedMotoServer
        self.port = _free_port()
        self.server: Any = None
        self.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = "soak-bucket"
        self.fs().mkdir(self.bucket)

    def start(self) -> None:
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return
            time.sleep(0.05)
        raise TimeoutError("moto S3 server did not come back")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def fs(self) -> Any:
        from lumos.storage.testing import s3_filesystem

        return s3_filesystem(self.endpoint)


# -- jobs -----------------------------------------------------------------------------------
@dataclass
class Job:
    kind: str  # "train" | "sweep"
    name: str
    storage: str  # "local" | "s3"
    spec: dict[str, Any]
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    killed_by_us: bool = False
    done: bool = False
    result: dict[str, Any] | None = None
    unexpected_exits: list[str] = field(default_factory=list)
    rerun_at: float | None = None

    def runs(self) -> list[str]:
        """Train run names whose worker markers belong to this job."""
        if self.kind == "train":
            return [self.name]
        root = Path(self.spec["loop"]["ledger_dir"]) / "markers"
        if not root.exists():
            return []
        return [p.name for p in root.iterdir() if p.name.startswith(f"{self.name}-")]


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"soak-{args.seed}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ledger_dir = self.workdir / "harness"
        self.local_root = self.workdir / "storage"
        self.local_root.mkdir(exist_ok=True)
        self.storages = ["local", "s3"] if args.storage == "both" else [args.storage]
        self.s3: S3 | None = None
        self.cluster: Any = None
        self.jobs: list[Job] = []
        self.faults: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.resumed = 0
        self.lost = 0
        self.violations: list[str] = []
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.watch: dict[str, Any] | None = None
        self._stamp_fs: Any = None
        self.storage_errors_until = 0.0  # overlapping periods: off once the last one ends
        self.stopped_pids: set[int] = set()
        self.removed_nodes = 0
        self.kinds = [k for k in ALL_KINDS if self._kind_enabled(k)]
        self.faults_file = self.ledger_dir / "storage-faults.json"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self._storage_faults({"enabled": False})

    def _storage_faults(self, settings: dict[str, Any]) -> None:
        """Switch FaultyFileSystem's faults in every process (its control file, atomically)."""
        tmp = self.faults_file.with_suffix(".json.new")
        tmp.write_text(json.dumps(settings))
        os.replace(tmp, self.faults_file)

    def _kind_enabled(self, kind: str) -> bool:
        if kind == "s3_restart":
            return "s3" in self.storages
        if kind == "storage_errors":
            return "s3" in self.storages and _has_faulty_fs()
        return True

    # -- setup --------------------------------------------------------------------------------
    def start(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # A loaded 2-core machine can take over the default 30 s to start the dashboard's modules.
        os.environ.setdefault("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "180")
        os.environ.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "240")
        if "s3" in self.storages:
            self.s3 = S3()
            log(f"moto S3 server at {self.s3.endpoint}")
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": True,  # the state API (leak checks) needs it
                "dashboard_host": "127.0.0.1",
                "dashboard_port": _free_port(),
            },
        )
        for _ in range(NODES):
            self.cluster.add_node(num_cpus=CPUS_PER_NODE)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)
        log(f"cluster at {self.cluster.address}: 0-CPU head + {NODES} x {CPUS_PER_NODE} CPUs")

    def shutdown(self) -> None:
        import ray

        for pid in list(self.stopped_pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for job in self.jobs:
            if job.proc is not None and job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        if self.s3 is not None:
            self.s3.stop()

    # -- the schedule ---------------------------------------------------------------------------
    def _schedule(self, at: float, what: str, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, what, arg))

    def plan_faults(self, t0: float, duration_s: float) -> list[tuple[float, str, int]]:
        """The seed's fault schedule: (offset s, kind, a random number for its target)."""
        plan = []
        t = self.rng.uniform(*FAULT_GAP_S)
        while t < duration_s:
            plan.append((t, self.rng.choice(self.kinds), self.rng.randrange(1 << 30)))
            t += self.rng.uniform(*FAULT_GAP_S)
        for offset, kind, pick in plan:
            self._schedule(t0 + offset, "fault", (kind, pick, 0))
        return plan

    # -- jobs -----------------------------------------------------------------------------------
    def _storage_path(self, storage: str) -> tuple[str, str | None]:
        if storage == "local":
            return str(self.local_root), None
        assert self.s3 is not None
        return f"s3://{self.s3.bucket}/soak", self.s3.endpoint

    def new_job(self, kind: str, name: str, storage: str, mode: str) -> Job:
        storage_path, endpoint = self._storage_path(storage)
        loop = {
            "run": name,
            "steps": TRAIN_STEPS if kind == "train" else SWEEP_STEPS,
            "step_s": STEP_S,
            "ckpt_every": CKPT_EVERY,
            "validate_every": VALIDATE_EVERY,
            "mode": mode,
            "shard_floats": SHARD_FLOATS,
            "ledger_dir": str(self.ledger_dir),
        }
        spec = {
            "name": name,
            "storage_path": storage_path,
            "endpoint": endpoint,
            "loop": loop,
            "num_to_keep": NUM_TO_KEEP,
            "num_samples": SWEEP_SAMPLES,
            "seed": self.args.seed,
            "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
            "faults_file": str(self.faults_file),
            "faults_records": str(self.ledger_dir / "storage-faults"),
        }
        cmd = [
            sys.executable,
            str(DRIVER),
            kind,
            "--address",
            self.cluster.address,
            "--spec",
            json.dumps(spec),
        ]
        job = Job(kind, name, storage, spec, cmd, self.workdir / "logs" / f"{name}.log")
        job.log_path.parent.mkdir(exist_ok=True)
        self.jobs.append(job)
        self.launch(job)
        return job

    def launch(self, job: Job) -> None:
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
        with open(job.log_path, "ab") as out:
            out.write(f"\n===== start {job.starts + 1} =====\n".encode())
            out.flush()
            job.proc = subprocess.Popen(job.cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        job.starts += 1
        if job.starts > 1:
            self.resumed += 1
        job.killed_by_us = False
        job.rerun_at = None
        log(f"started driver {job.name} ({job.kind}, {job.storage}, start {job.starts})")

    def poll_jobs(self, now: float) -> None:
        for job in self.jobs:
            if job.done:
                continue
            if job.proc is None:
                if job.rerun_at is not None and now >= job.rerun_at:
                    self.launch(job)
                continue
            rc = job.proc.poll()
            if rc is None:
                continue
            job.proc = None
            if rc == 0:
                job.done = True
                job.result = _result_of(job.log_path)
                log(f"driver {job.name} finished")
                continue
            if not job.killed_by_us:
                tail = job.log_path.read_text(errors="replace")[-3000:]
                job.unexpected_exits.append(f"exit {rc}:\n{tail}")
                log(f"driver {job.name} exited {rc} unexpectedly; log tail:\n{tail}")
                if len(job.unexpected_exits) >= MAX_UNEXPECTED_EXITS:
                    job.done = True
                    continue
            job.rerun_at = now + RERUN_DELAY_S

    def live_jobs(self) -> list[Job]:
        return [j for j in self.jobs if not j.done and j.proc is not None]

    # -- worker processes -----------------------------------------------------------------------
    def _markers(self, job: Job) -> list[dict[str, Any]]:
        import psutil

        found = []
        for run in job.runs():
            directory = self.ledger_dir / "markers" / run
            for path in sorted(directory.glob("rank*.json")):
                with contextlib.suppress(OSError, ValueError):
                    doc = json.loads(path.read_text())
                    if (
                        psutil.pid_exists(int(doc["pid"]))
                        and int(doc["pid"]) not in self.stopped_pids
                    ):
                        doc["run"] = run
                        found.append(doc)
        return found

    def _pick_worker(self, pick: int) -> tuple[Job, dict[str, Any]] | None:
        candidates = [(j, m) for j in self.live_jobs() for m in self._markers(j)]
        if not candidates:
            return None
        candidates.sort(key=lambda c: (c[0].name, c[1]["run"], c[1]["pid"]))
        return candidates[pick % len(candidates)]

    # -- faults ---------------------------------------------------------------------------------
    def fire(self, kind: str, pick: int, now: float, tries: int) -> None:
        ok = False
        if self.watch is None:  # one watched fault at a time
            try:
                ok = getattr(self, f"_fault_{kind}")(pick, now)
            except Exception:  # a fault that could not be applied is retried, not a violation
                log(f"fault {kind} failed to apply:\n{traceback.format_exc()}")
        if ok:
            if kind not in WATCHED:  # a watched fault counts when it hits (poll_watch)
                self.faults[kind] += 1
        elif tries < RETRY_FAULT_TRIES:  # no target yet (workers starting): try again soon
            self._schedule(now + RETRY_FAULT_S, "fault", (kind, pick, tries + 1))
        else:
            self.skipped[kind] += 1

    def _signal_worker(self, pick: int, sig: int, what: str) -> tuple[Job, int] | None:
        chosen = self._pick_worker(pick)
        if chosen is None:
            return None
        job, marker = chosen
        pid = int(marker["pid"])
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        log(f"{what}: pid {pid} (run {marker['run']}, {marker['doing']} {marker['step']})")
        return job, pid

    def _fault_worker_kill(self, pick: int, now: float) -> bool:
        return self._signal_worker(pick, signal.SIGKILL, "worker SIGKILL") is not None

    def _fault_preempt(self, pick: int, now: float) -> bool:
        if pick % 2:
            return (
                self._signal_worker(pick, signal.SIGTERM, "preemption notice (SIGTERM)") is not None
            )
        return self._drain_node(pick, now)

    def _drain_node(self, pick: int, now: float) -> bool:
        """A spot-style notice: drain a worker node (deadline in 15 s), then it goes away."""
        import ray
        from ray.core.generated import autoscaler_pb2

        nodes = list(self.cluster.worker_nodes)
        if len(nodes) < NODES:
            return False  # one is already out
        node = sorted(nodes, key=lambda n: n.node_id)[pick % len(nodes)]
        gcs = ray._raylet.GcsClient(address=self.cluster.address)
        accepted, why = gcs.drain_node(
            node.node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "soak: spot instance reclaimed",
            int((time.time() + DRAIN_DEADLINE_S) * 1000),
        )
        if not accepted:
            log(f"node drain refused: {why}")
            return False
        log(
            f"preemption notice: node {node.node_id[:8]} draining, removed in {DRAIN_DEADLINE_S:.0f} s"
        )
        self._schedule(now + DRAIN_DEADLINE_S, "remove_drained", node)
        return True

    def _fault_worker_hang(self, pick: int, now: float) -> bool:
        hit = self._signal_worker(pick, signal.SIGSTOP, "worker SIGSTOP")
        if hit is None:
            return False
        self.stopped_pids.add(hit[1])
        # Half the hangs end before the health check's limit (tolerated), half after (replaced).
        hang_s = 3.0 + pick % 5 if pick % 2 else HEALTH_CHECK_TIMEOUT_S + 5.0 + pick % 5
        self._schedule(now + hang_s, "sigcont", hit[1])
        return True

    def _fault_driver_kill(self, pick: int, now: float) -> bool:
        live = sorted(self.live_jobs(), key=lambda j: j.name)
        if not live:
            return False
        self._kill_driver(live[pick % len(live)], "driver SIGKILL")
        return True

    def _kill_driver(self, job: Job, what: str) -> None:
        assert job.proc is not None
        job.killed_by_us = True
        job.proc.send_signal(signal.SIGKILL)
        log(f"{what}: {job.name} (pid {job.proc.pid})")

    def _fault_node_cycle(self, pick: int, now: float) -> bool:
        nodes = list(self.cluster.worker_nodes)
        if len(nodes) < NODES:
            return False  # one is already out
        node = sorted(nodes, key=lambda n: n.node_id)[pick % len(nodes)]
        self.cluster.remove_node(node, allow_graceful=False)
        log(f"node removed: {node.node_id[:8]}; re-added in {3 + pick % 6} s")
        self._schedule(now + 3.0 + pick % 6, "add_node", None)
        return True

    def _fault_s3_restart(self, pick: int, now: float) -> bool:
        if self.s3 is None or self.s3.server is None:
            return False
        self.s3.stop()
        log(f"S3 server down for {1 + pick % 3} s")
        self._schedule(now + 1.0 + pick % 3, "s3_start", None)
        return True

    def _fault_storage_errors(self, pick: int, now: float) -> bool:
        if not any(j.storage == "s3" for j in self.live_jobs()):
            return False
        rate = (0.05, 0.1, 0.2)[pick % 3]
        period = 5.0 + pick % 10
        self._storage_faults(
            {
                "enabled": True,
                "write_failure_rate": rate,
                "rename_failure_rate": rate,
                "list_failure_rate": rate,
            }
        )
        log(
            f"storage errors on S3: {rate:.0%} of writes, renames, listings fail for {period:.0f} s"
        )
        self.storage_errors_until = max(self.storage_errors_until, now + period)
        self._schedule(now + period, "storage_errors_off", None)
        return True

    def _fault_kill_in_upload(self, pick: int, now: float) -> bool:
        live = sorted(self.live_jobs(), key=lambda j: j.name)
        if not live:
            return False
        self.watch = {
            "kind": "kill_in_upload",
            "job": live[pick % len(live)],
            "since": time.time(),
            "until": now + 15,
        }
        return True

    def _fault_driver_kill_in_state_write(self, pick: int, now: float) -> bool:
        live = sorted((j for j in self.live_jobs() if j.kind == "train"), key=lambda j: j.name)
        if not live:
            return False
        job = live[pick % len(live)]
        self.watch = {
            "kind": "driver_kill_in_state_write",
            "job": job,
            "first": self._state_stamp(job),
            "until": now + 15,
        }
        return True

    def _state_stamp(self, job: Job) -> Any:
        storage_path = job.spec["storage_path"]
        if job.storage == "local":
            state_dir = Path(storage_path) / job.name / "_lumos"
            with contextlib.suppress(OSError):
                if any(".tmp-" in n for n in os.listdir(state_dir)):
                    return "tmp"
                return os.stat(state_dir / "run_state.json").st_mtime_ns
            return None
        assert self.s3 is not None
        if self._stamp_fs is None:
            self._stamp_fs = self.s3.fs()
        try:
            info = self._stamp_fs.info(f"{storage_path[5:]}/{job.name}/_lumos/run_state.json")
        except Exception as exc:  # the server is down, or no state yet
            return f"error {type(exc).__name__}"
        return info.get("ETag")

    def poll_watch(self, now: float) -> None:
        w = self.watch
        if w is None:
            return
        job: Job = w["job"]
        if job.proc is None or job.done or now > w["until"]:
            log(f"{w['kind']}: nothing to hit in time on {job.name}")
            self.skipped[w["kind"]] += 1
            self.watch = None
            return
        if w["kind"] == "kill_in_upload":
            for m in self._markers(job):
                if m["doing"] == "checkpoint" and m["t"] >= w["since"]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(m["pid"]), signal.SIGKILL)
                        log(
                            f"worker SIGKILL in checkpoint upload: pid {m['pid']} ({m['run']} step {m['step']})"
                        )
                        self.faults["kill_in_upload"] += 1
                    self.watch = None
                    return
        else:
            stamp = self._state_stamp(job)
            if stamp is not None and not str(stamp).startswith("error") and stamp != w["first"]:
                self._kill_driver(
                    job,
                    f"driver SIGKILL in state write ({'temp file seen' if stamp == 'tmp' else 'state changed'})",
                )
                self.faults["driver_kill_in_state_write"] += 1
                self.watch = None

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> int:
        minutes = float(self.args.minutes)
        t0 = time.monotonic()
        # Faults fire for the first 80% of the time; the rest lets the last round finish.
        budget = minutes * 60.0
        plan = self.plan_faults(t0, budget * 0.8)
        log(
            f"seed {self.args.seed}: {len(plan)} faults planned: {dict(Counter(k for _, k, _ in plan))}"
        )
        round_no = 0
        round_len = 75.0  # a round's jobs take about this long under faults on 2 cores
        deadline = t0 + budget + FINISH_GRACE_S  # a job that never finishes is a violation
        while True:
            now = time.monotonic()
            if all(j.done for j in self.jobs) and (
                round_no == 0 or now - t0 < budget * 0.8 - round_len
            ):
                self.start_round(round_no)
                round_no += 1
            if all(j.done for j in self.jobs):
                break
            if now > deadline:
                for j in self.jobs:
                    if not j.done:
                        self.violations.append(f"{j.name}: did not finish before the hard deadline")
                break
            while self.events and self.events[0][0] <= now:
                _, _, what, arg = heapq.heappop(self.events)
                if what == "fault":
                    self.fire(arg[0], arg[1], now, arg[2])
                elif what == "sigcont":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(arg, signal.SIGCONT)
                    self.stopped_pids.discard(arg)
                    log(f"worker SIGCONT: pid {arg}")
                elif what == "add_node":
                    self.cluster.add_node(num_cpus=CPUS_PER_NODE)
                    log("node added")
                elif what == "remove_drained":
                    if arg in self.cluster.worker_nodes:
                        self.cluster.remove_node(arg, allow_graceful=False)
                    self.cluster.add_node(num_cpus=CPUS_PER_NODE)
                    log("drained node removed, a new node added")
                elif what == "s3_start":
                    assert self.s3 is not None
                    self.s3.start()
                    log("S3 server up")
                elif what == "storage_errors_off" and now >= self.storage_errors_until:
                    self._storage_faults({"enabled": False})
                    log("storage errors off")
            self.poll_jobs(now)
            self.poll_watch(now)
            time.sleep(0.005 if self.watch else 0.1)
        # Pending follow-ups (SIGCONT, node add, S3 up) run before the checks.
        for _, _, what, arg in sorted(self.events):
            if what == "sigcont":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(arg, signal.SIGCONT)
            elif what == "add_node":
                self.cluster.add_node(num_cpus=CPUS_PER_NODE)
            elif what == "remove_drained":
                if arg in self.cluster.worker_nodes:
                    self.cluster.remove_node(arg, allow_graceful=False)
                self.cluster.add_node(num_cpus=CPUS_PER_NODE)
            elif what == "s3_start" and self.s3 is not None:
                self.s3.start()
            elif what == "storage_errors_off":
                self._storage_faults({"enabled": False})
        self.events.clear()
        self.stopped_pids.clear()
        log(f"all drivers ended after {time.monotonic() - t0:.0f} s; checking invariants")
        from soak_checks import check_all

        self.lost, violations = check_all(self)
        self.violations += violations
        return self.report()

    def start_round(self, round_no: int) -> None:
        modes = ["sync", "async"] if round_no % 2 == 0 else ["async", "sync"]
        for i, storage in enumerate(self.storages):
            self.new_job(
                "train", f"train-r{round_no}-{storage}-{modes[i % 2]}", storage, modes[i % 2]
            )
        if self.args.sweep and round_no % 2 == 0:
            storage = self.storages[(round_no // 2) % len(self.storages)]
            self.new_job("sweep", f"sweep-r{round_no}-{storage}", storage, "sync")

    def report(self) -> int:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none"
        if self.skipped:
            log(
                "faults skipped (no target at the time): "
                + ", ".join(f"{k} {n}" for k, n in sorted(self.skipped.items()))
            )
        log(f"workdir: {self.workdir}")
        line = (
            f"faults injected: {sum(self.faults.values())} ({kinds}) · runs resumed: {self.resumed} · "
            f"committed checkpoints lost: {self.lost} · invariant violations: {len(self.violations)}"
        )
        (self.workdir / "result.txt").write_text(line + "\n")
        print(line, flush=True)
        return 1 if self.violations or self.lost else 0


def _result_of(log_path: Path) -> dict[str, Any] | None:
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--storage", choices=["local", "s3", "both"], default="both")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument(
        "--workdir", help="where storage, ledger and logs go (default: a new temp dir)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    harness = Harness(args)
    try:
        harness.start()
        return harness.run()
    finally:
        harness.shutdown()


if __name__ == "__main__":
    sys.exit(main())
