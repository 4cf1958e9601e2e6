"""The chaos soak: Train runs and a Tune-over-Train sweep under seeded random faults.

    python integration-tests/soak/soak.py --minutes 5 --seed 7 [--storage local|s3|both]
    python integration-tests/soak/soak.py --minutes 5 --seeds 3    # 3 fresh seeds in a row

The harness (this process) starts a simulated multi-node Ray cluster (a 0-CPU head
and 3 worker nodes), moto's S3 server on 127.0.0.1, and runs every workload as a
driver subprocess (``soak_driver.py``) connected to the cluster, so that a driver
can be SIGKILLed and started again with the same ``RunConfig``. A seeded fault
injector fires faults at random times (the schedule of kinds and gaps is a function
of the seed alone; the timing on the machine differs). When every workload finished,
the invariants are checked, each printed ``PASS``/``FAIL`` with the run or trial it
concerns and, for a failure, its evidence; then the failed checks again, the soak's
state directory (``soak state: DIR``, also printed at the start), the command that
reruns a failing seed, and last

    faults injected: N (kind a, ...) · runs resumed: R · committed checkpoints lost: L · invariant violations: V

The exit status is non-zero on any violation; ``--seed`` reproduces the schedule.
``--seeds N`` runs N fresh seeds (drawn from ``os.urandom`` and the clock, never the
repository's own), each in its own state directory, and stops at the first failure.

Workloads per round (rounds start while there is time left):

* a Train run on each storage (local disk / moto S3): 2 workers, sharded
  checkpoints (each rank saves ``shard-<rank>.pt``; 11 MiB shards on S3, uploaded in
  5 MiB multipart parts), SYNC and ASYNC uploads (they swap between the storages
  every round), validation, ``max_failures=-1``; the local run of an even round
  writes to a tmpfs of its own (a disk that can fill up);
* a Tune-over-Train sweep (ASHA pruning) on one storage, every other round
  (``--no-sweep`` leaves it out);
* a Train run with ``TorchftConfig`` (per-step fault tolerance: every rank a torchft
  replica, an elastic group of 2 to 3 workers, SYNC checkpoints that rank 0 saves),
  on each storage in turn (``--no-torchft`` leaves it out; left out when torchft is
  not installed).

The fault kinds are in README.md (this folder), with what each does; ``soak_faults.py``
implements them, ``soak_checks.py`` the invariants.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import importlib.util
import json
import logging
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# A loaded 2-core machine can take over the defaults (30 s for the dashboard's modules, 60 s
# for the dashboard) to start the head's dashboard. Ray reads the second when it is first
# imported (ray_constants), so both are set before anything here imports ray.
os.environ.setdefault("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "180")
os.environ.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "240")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_config import (
    ALL_KINDS,
    BUILT_IN_SEEDS,
    CKPT_EVERY,
    CPUS_PER_NODE,
    DISK_SIZE,
    DRIVER,
    FAULT_GAP_S,
    FINISH_GRACE_S,
    HANG_TIMEOUT_S,
    HEALTH_CHECK_TIMEOUT_S,
    HERE,
    MAX_UNEXPECTED_EXITS,
    NODES,
    NUM_TO_KEEP,
    RERUN_DELAY_S,
    RETRY_FAULT_S,
    RETRY_FAULT_TRIES,
    S3_SHARD_FLOATS,
    SHARD_FLOATS,
    STEP_S,
    SWEEP_SAMPLES,
    SWEEP_STEPS,
    TRAIN_STEPS,
    VALIDATE_EVERY,
    VALIDATE_S,
    WATCHED,
    Exit,
    Job,
    add_node,
    log,
    log_tail,
    result_of,
)
from soak_faults_driver import DriverFaults

__all__ = ["ALL_KINDS", "FAULT_GAP_S", "Harness", "main"]


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


def _can_mount() -> bool:
    """Whether this process may mount a tmpfs (root on Linux): the disk_full fault needs it."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    from soak_traps import SmallDisk

    with tempfile.TemporaryDirectory(prefix="soak-mount-") as d:
        disk = SmallDisk.mount(Path(d) / "probe", "1m")
        if disk is None:
            return False
        disk.unmount_keeping_files()
    return True


# -- the S3 server: moto keeps its objects in this process across restarts ------------------
class S3:
    """moto's S3 server on a fixed port; ``stop`` + ``start`` restart the HTTP front only."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer
        from soak_traps import DroppedWrite, install_put_hook

        werkzeug = logging.getLogger("werkzeug")
        werkzeug.setLevel(logging.WARNING)
        # A write the final-state-write trap dropped is a 500 to a client already dead.
        werkzeug.addFilter(lambda r: DroppedWrite.__name__ not in str(r.msg))
        install_put_hook()  # the final-state-write trap sits in moto's put_object
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


class Harness(DriverFaults):
    """The soak: its cluster, S3 server, jobs, fault schedule, and the checks at the end."""

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
        self.stalls: Counter[str] = Counter()
        self.stall_until: dict[str, float] = {}
        self.unreached: Counter[str] = Counter()  # planned, but every job had ended
        self.resumed = 0
        self.lost = 0
        self.violations: list[str] = []
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.watches: list[dict[str, Any]] = []
        self._stamp_fs: Any = None
        self.storage_errors_until = 0.0  # overlapping periods: off once the last one ends
        self.stopped_pids: set[int] = set()
        self.mount_ok = "local" in self.storages and _can_mount()  # disk_full needs a tmpfs
        only = getattr(args, "kinds", None)
        self.kinds = [k for k in ALL_KINDS if self._kind_enabled(k) and (not only or k in only)]
        self.faults_file = self.ledger_dir / "storage-faults.json"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self._storage_faults({"enabled": False})

    def _storage_faults(self, settings: dict[str, Any]) -> None:
        """Switch FaultyFileSystem's faults in every process (its control file, atomically)."""
        tmp = self.faults_file.with_suffix(".json.new")
        tmp.write_text(json.dumps(settings))
        os.replace(tmp, self.faults_file)

    def _kind_enabled(self, kind: str) -> bool:
        if kind in ("s3_restart", "s3_restart_in_multipart"):
            return "s3" in self.storages
        if kind == "storage_errors":
            return "s3" in self.storages and _has_faulty_fs()
        if kind == "disk_full":
            return self.mount_ok
        return True

    # -- setup --------------------------------------------------------------------------------
    def start(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
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
            add_node(self.cluster)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)
        log(f"cluster at {self.cluster.address}: 0-CPU head + {NODES} x {CPUS_PER_NODE} CPUs")

    def shutdown(self) -> None:
        import ray

        for w in self.watches:
            self.end_watch(w)
        for pid in list(self.stopped_pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        procs = [j.proc for j in self.jobs] + [w.get("proc") for w in self.watches]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        if self.s3 is not None:
            self.s3.stop()
        for job in self.jobs:
            if job.disk is not None:
                job.disk.unmount_keeping_files()

    # -- the schedule ---------------------------------------------------------------------------
    def _schedule(self, at: float, what: str, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, what, arg))

    def plan_faults(self, t0: float, duration_s: float) -> list[tuple[float, str, int]]:
        """The seed's fault schedule: (offset s, kind, a random number for its target).

        Kinds come from seeded shuffles of every enabled kind (each kind once in every
        ``len(kinds)`` faults), so a short soak still sees most kinds.
        """
        plan: list[tuple[float, str, int]] = []
        bag: list[str] = []
        t = self.rng.uniform(*FAULT_GAP_S)
        while t < duration_s:
            if not bag:
                bag = list(self.kinds)
                self.rng.shuffle(bag)
            plan.append((t, bag.pop(), self.rng.randrange(1 << 30)))
            t += self.rng.uniform(*FAULT_GAP_S)
        for offset, kind, pick in plan:
            self._schedule(t0 + offset, "fault", (kind, pick, 0))
        return plan

    def fire(self, kind: str, pick: int, now: float, tries: int) -> None:
        ok = False
        try:
            ok = getattr(self, f"_fault_{kind}")(pick, now)
        except Exception as exc:  # a fault that could not be applied is retried, not a violation
            log(f"fault {kind} failed to apply: {type(exc).__name__}: {exc}")
        if ok:
            if kind not in WATCHED:  # a watched fault counts when it hits (poll_watches)
                self.faults[kind] += 1
        elif tries < RETRY_FAULT_TRIES:  # no target yet (workers starting): try again soon
            self._schedule(now + RETRY_FAULT_S, "fault", (kind, pick, tries + 1))
        else:
            self.skipped[kind] += 1

    # -- jobs -----------------------------------------------------------------------------------
    def _storage_path(self, kind: str, name: str, storage: str, round_no: int) -> tuple[str, Any]:
        """Where the job's run goes, and its small disk (local Train runs of even rounds)."""
        if storage == "s3":
            assert self.s3 is not None
            return f"s3://{self.s3.bucket}/soak", None
        if kind == "train" and round_no % 2 == 0 and self.mount_ok:
            from soak_traps import SmallDisk

            disk = SmallDisk.mount(self.local_root / f"disk-{name}", DISK_SIZE)
            if disk is not None:
                log(f"{name} writes to a tmpfs of {DISK_SIZE} at {disk.path}")
                return str(disk.path), disk
        return str(self.local_root), None

    def new_job(
        self, kind: str, name: str, storage: str, mode: str, round_no: int = 0, ft: bool = False
    ) -> Job:
        storage_path, disk = self._storage_path(kind, name, storage, round_no)
        big = storage == "s3" and kind == "train"
        loop = {
            "run": name,
            "steps": TRAIN_STEPS if kind == "train" else SWEEP_STEPS,
            "step_s": STEP_S,
            "ckpt_every": CKPT_EVERY,
            "validate_every": VALIDATE_EVERY,
            "mode": mode,
            "shard_floats": S3_SHARD_FLOATS if big else SHARD_FLOATS,
            "ledger_dir": str(self.ledger_dir),
            "torchft": ft,
        }
        spec = {
            "name": name,
            "storage_path": storage_path,
            "endpoint": self.s3.endpoint if storage == "s3" and self.s3 else None,
            "loop": loop,
            "num_to_keep": NUM_TO_KEEP,
            "num_samples": SWEEP_SAMPLES,
            "seed": self.args.seed,
            "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
            "hang_timeout_s": HANG_TIMEOUT_S,
            "validate_s": VALIDATE_S,
            "faults_file": str(self.faults_file),
            "faults_records": str(self.ledger_dir / "storage-faults"),
            "torchft": ft,
        }
        cmd = [sys.executable, str(DRIVER), kind, "--address", self.cluster.address]
        cmd += ["--spec", json.dumps(spec)]
        job = Job(kind, name, storage, spec, cmd, self.workdir / "logs" / name, disk=disk)
        job.log_dir.mkdir(parents=True, exist_ok=True)
        self.jobs.append(job)
        self.launch(job)
        return job

    def launch(self, job: Job) -> None:
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
        job.starts += 1
        with open(job.log_path, "ab") as out:
            job.proc = subprocess.Popen(job.cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        if job.starts > 1:
            self.resumed += 1
        job.killed_by_us = False
        job.rerun_at = None
        log(
            f"started driver {job.name} ({job.kind}, {job.storage}, start {job.starts}, "
            f"pid {job.proc.pid}, log {job.log_path})"
        )

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
            self._ended(job, rc, now)

    def _ended(self, job: Job, rc: int, now: float) -> None:
        planned = self.disk_full_exit(job, rc)
        if job.killed_by_us:
            why = "killed by the soak"
        elif planned is not None:
            why = planned
        else:
            why = "ok" if rc == 0 else "unexpected"
        job.exits.append(Exit(job.starts, rc, job.log_path, why))
        if rc == 0:
            job.done = True
            job.result = result_of(job.log_path)
            log(f"driver {job.name} finished (start {job.starts})")
            return
        if why == "unexpected":
            tail = "\n".join(f"    | {line}" for line in log_tail(job.log_path))
            log(
                f"driver {job.name} start {job.starts} exited {rc} unexpectedly "
                f"(log {job.log_path}); its last lines:\n{tail}"
            )
            if len(job.unexpected_exits) >= MAX_UNEXPECTED_EXITS:
                job.done = True
                return
        job.rerun_at = now + RERUN_DELAY_S

    def live_jobs(self) -> list[Job]:
        return [j for j in self.jobs if not j.done and j.proc is not None]

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> int:
        minutes = float(self.args.minutes)
        t0 = time.monotonic()
        # Faults fire for the first 80% of the time; the rest lets the last round finish.
        budget = minutes * 60.0
        plan = self.plan_faults(t0, budget * 0.8)
        planned = dict(Counter(k for _, k, _ in plan))
        log(f"seed {self.args.seed}: {len(plan)} faults planned: {planned}")
        round_no = 0
        deadline = t0 + budget + FINISH_GRACE_S  # a job that never finishes is a violation
        while True:
            now = time.monotonic()
            idle = all(j.done for j in self.jobs)
            # A new round while faults are still to come (it may finish in the last 20%).
            if idle and (round_no == 0 or now - t0 < budget * 0.8):
                self.start_round(round_no)
                round_no += 1
            # The lease stall and a filled disk end themselves; the soak waits for them.
            owned = [
                w
                for w in self.watches
                if w["kind"] not in WATCHED or (w["kind"] == "disk_full" and w["job"] is not None)
            ]
            if all(j.done for j in self.jobs) and not owned:
                break
            if now > deadline:
                self.past_deadline()
                break
            while self.events and self.events[0][0] <= now:
                _, _, what, arg = heapq.heappop(self.events)
                if what == "fault":
                    self.fire(arg[0], arg[1], now, arg[2])
                else:
                    self.follow_up(what, arg, now)
            self.poll_jobs(now)
            self.poll_watches(now)
            time.sleep(self.watch_interval())
        # Pending follow-ups (SIGCONT, node add, S3 up) run before the checks.
        for _, _, what, arg in sorted(self.events):
            if what != "fault":
                self.follow_up(what, arg, float("inf"))
            else:
                self.unreached[arg[0]] += 1
        self._storage_faults({"enabled": False})
        for w in self.watches:  # armed, never hit: every job had ended
            self.end_watch(w)
            if w["kind"] in WATCHED:
                self.skipped[w["kind"]] += 1
        self.watches.clear()
        self.events.clear()
        self.stopped_pids.clear()
        log(f"all drivers ended after {time.monotonic() - t0:.0f} s; checking invariants")
        from soak_checks import check_all

        self.lost, violations = check_all(self)
        self.violations += violations
        return self.report()

    def past_deadline(self) -> None:
        """The hard deadline passed: each job still running is a violation; its driver is
        killed (the checks then read what it left)."""
        for j in self.jobs:
            if j.done:
                continue
            what = f"{j.name}: did not finish before the hard deadline"
            where = f"start {j.starts}, log {j.log_path}"
            print(f"FAIL {what} ({where}); its last lines:", flush=True)
            for line in log_tail(j.log_path):
                print(f"      | {line}", flush=True)
            self.violations.append(f"{what} ({where})")
            if j.proc is not None and j.proc.poll() is None:
                j.killed_by_us = True
                j.proc.kill()
                rc = j.proc.wait()
                j.exits.append(Exit(j.starts, rc, j.log_path, "killed at the hard deadline"))
                log(f"driver SIGKILL at the hard deadline: {j.name} (pid {j.proc.pid})")
                j.proc = None
            j.done = True
        for w in self.watches:
            proc = w.get("proc")
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
                log(f"stale driver SIGKILL at the hard deadline: pid {proc.pid}")

    def start_round(self, round_no: int) -> None:
        modes = ["sync", "async"] if round_no % 2 == 0 else ["async", "sync"]
        for i, storage in enumerate(self.storages):
            mode = modes[i % 2]
            self.new_job("train", f"train-r{round_no}-{storage}-{mode}", storage, mode, round_no)
        if self.args.torchft:  # per-step fault tolerance (torchft): one more Train run
            storage = self.storages[round_no % len(self.storages)]
            name = f"train-r{round_no}-{storage}-ft"
            self.new_job("train", name, storage, "sync", round_no, ft=True)
        if self.args.sweep and round_no % 2 == 0:
            storage = self.storages[(round_no // 2) % len(self.storages)]
            self.new_job("sweep", f"sweep-r{round_no}-{storage}", storage, "sync", round_no)

    def report(self) -> int:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none"
        if self.skipped:
            skipped = ", ".join(f"{k} {n}" for k, n in sorted(self.skipped.items()))
            log(f"faults skipped (no target at the time): {skipped}")
        if self.unreached:
            unreached = ", ".join(f"{k} {n}" for k, n in sorted(self.unreached.items()))
            log(f"faults not reached (every job had ended): {unreached}")
        log(self.hang_alarms())
        if self.violations:
            print(f"failed checks ({len(self.violations)}):", flush=True)
            for v in self.violations:
                print(f"  FAIL {v}", flush=True)
        print(f"soak state: {self.workdir}", flush=True)
        if self.violations or self.lost:
            print(f"rerun this seed: {rerun_command(self.args, self.args.seed)}", flush=True)
        line = (
            f"faults injected: {sum(self.faults.values())} ({kinds}) · runs resumed: {self.resumed} · "
            f"committed checkpoints lost: {self.lost} · invariant violations: {len(self.violations)}"
        )
        (self.workdir / "result.txt").write_text(line + "\n")
        print(line, flush=True)
        return 1 if self.violations or self.lost else 0


# -- the command line ---------------------------------------------------------------------------
def torchft_installed() -> bool:
    """Whether the Train run with ``TorchftConfig`` can run here (the extra is optional)."""
    return importlib.util.find_spec("torchft") is not None


def rerun_command(args: argparse.Namespace, seed: int) -> str:
    """The command that runs ``seed`` again with the same settings."""
    script = os.path.relpath(HERE / "soak.py")
    parts = ["python", script, "--minutes", f"{args.minutes:g}", "--seed", str(seed)]
    if args.storage != "both":
        parts += ["--storage", args.storage]
    if not args.sweep:
        parts.append("--no-sweep")
    if not getattr(args, "torchft", True):
        parts.append("--no-torchft")
    if getattr(args, "kinds", None):
        parts += ["--kinds", ",".join(args.kinds)]
    return shlex.join(parts)


def fresh_seed(previous: set[int]) -> int:
    """A seed from ``os.urandom`` and the clock: never a built-in one, never one run before."""
    while True:
        seed = (int.from_bytes(os.urandom(4), "big") ^ time.time_ns()) % (1 << 31)
        if seed not in BUILT_IN_SEEDS and seed not in previous:
            return seed


def run_seeds(args: argparse.Namespace) -> int:
    """``--seeds N``: N fresh seeds in a row, each a soak of its own; stop at the first failure."""
    done: list[int] = []
    for i in range(args.seeds):
        seed = fresh_seed(set(done))
        log(f"seed {i + 1} of {args.seeds}: {seed} (fresh: os.urandom and the clock)")
        cmd = [sys.executable, str(HERE / "soak.py"), "--minutes", f"{args.minutes:g}"]
        cmd += ["--seed", str(seed), "--storage", args.storage]
        if not args.sweep:
            cmd.append("--no-sweep")
        if not args.torchft:
            cmd.append("--no-torchft")
        if args.kinds:
            cmd += ["--kinds", ",".join(args.kinds)]
        if args.workdir:
            cmd += ["--workdir", str(Path(args.workdir) / f"seed-{seed}")]
        rc = subprocess.call(cmd)
        if rc != 0:
            print(
                f"seeds: seed {seed} failed (exit {rc}, run {i + 1} of {args.seeds}); "
                f"rerun it: {rerun_command(args, seed)}",
                flush=True,
            )
            return 1
        done.append(seed)
    print(f"seeds: all {args.seeds} passed ({', '.join(map(str, done))})", flush=True)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, required=True)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="one soak with this seed (reproduces its faults)")
    which.add_argument(
        "--seeds", type=int, help="this many fresh seeds in a row; stops at the first failure"
    )
    parser.add_argument("--storage", choices=["local", "s3", "both"], default="both")
    parser.add_argument(
        "--kinds",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        help="only these fault kinds, comma-separated (default: every kind; see README.md)",
    )
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument(
        "--no-torchft",
        dest="torchft",
        action="store_false",
        help="leave out the Train run with TorchftConfig",
    )
    parser.add_argument(
        "--workdir",
        help="the soak's state (storage, ledger, logs) goes here (default: a new temp dir; "
        "with --seeds, one folder per seed under it)",
    )
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    unknown = sorted(set(args.kinds or ()) - set(ALL_KINDS))
    if unknown:
        parser.error(f"--kinds: unknown kind(s) {unknown}; the kinds are {', '.join(ALL_KINDS)}")
    if args.minutes <= 0:
        parser.error(f"--minutes must be positive, got {args.minutes:g}")
    if args.torchft and not torchft_installed():
        log("torchft is not installed: no Train run with TorchftConfig")
        args.torchft = False
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seeds is not None:
        return run_seeds(args)
    harness = Harness(args)
    print(f"soak state: {harness.workdir}", flush=True)
    try:
        harness.start()
        return harness.run()
    except BaseException:
        print(f"soak state: {harness.workdir}", flush=True)
        print(f"rerun this seed: {rerun_command(args, args.seed)}", flush=True)
        raise
    finally:
        harness.shutdown()


if __name__ == "__main__":
    sys.exit(main())
