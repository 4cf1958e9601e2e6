"""The soak's faults: how each kind picks its target, fires, and (for watched kinds) waits
for its moment. Mixed into ``soak.Harness``; every fault logs when it fired and on what.

A fault method ``_fault_<kind>(pick, now)`` returns False when it has no target yet (the
harness tries again 2 s later, up to 10 times). Watched kinds arm a watch (a dict with
its ``kind``, ``job`` and ``until``) that ``poll_watches`` drives; a watch counts its
fault when it hits, and is skipped when its job ends or its time runs out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from soak_config import (
    DRAIN_DEADLINE_S,
    HANG_TIMEOUT_S,
    HEALTH_CHECK_TIMEOUT_S,
    NODES,
    WATCH_DEFAULT_S,
    WATCH_S,
    WATCHED,
    Job,
    add_node,
    log,
)

#: The hang watchdog's own line (the restart's failure description repeats it otherwise)
_WATCHDOG_LINE = re.compile(r"^(?:\[lumos\.train\] )?rank \d+ on node \S+ stuck at ", re.M)


class WorkerFaults:
    """Faults on training workers, nodes and the S3 server (the first kinds of the soak)."""

    faults: Counter[str]
    skipped: Counter[str]
    stopped_pids: set[int]
    watches: list[dict[str, Any]]
    ledger_dir: Path
    cluster: Any
    s3: Any
    jobs: list[Job]
    #: user_thread_stall faults by length: "short" (must not fire the watchdog), "long"
    stalls: Counter[str]
    #: per run: until when its current stall (and the restart after it) lasts
    stall_until: dict[str, float]

    def _schedule(self, at: float, what: str, arg: Any = None) -> None:
        raise NotImplementedError

    def live_jobs(self) -> list[Job]:
        raise NotImplementedError

    def _markers(self, job: Job) -> list[dict[str, Any]]:
        import psutil

        found = []
        for run in job.runs(self.ledger_dir):
            directory = self.ledger_dir / "markers" / run
            for path in sorted(directory.glob("rank*.json")):
                with contextlib.suppress(OSError, ValueError):
                    doc = json.loads(path.read_text())
                    pid = int(doc["pid"])
                    if psutil.pid_exists(pid) and pid not in self.stopped_pids:
                        doc["run"] = run
                        found.append(doc)
        return found

    def _pick_worker(self, pick: int) -> tuple[Job, dict[str, Any]] | None:
        candidates = [(j, m) for j in self.live_jobs() for m in self._markers(j)]
        if not candidates:
            return None
        candidates.sort(key=lambda c: (c[0].name, c[1]["run"], c[1]["pid"]))
        return candidates[pick % len(candidates)]

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
            notice = "preemption notice (SIGTERM)"
            return self._signal_worker(pick, signal.SIGTERM, notice) is not None
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

    def _fault_user_thread_stall(self, pick: int, now: float) -> bool:
        """A rank's training thread sleeps (outside lumos): before its all-reduce (the
        others wait in it) or after it (they wait in the next one). Short stalls (3-7 s)
        must not fire the hang watchdog; long ones (hang_timeout_s + 10 s) must, once."""
        from soak_workloads import stall_file

        chosen = self._pick_worker(pick)
        if chosen is None or chosen[0].kind != "train":  # a sweep's runs print no lines
            return False
        marker = chosen[1]
        if self.stall_until.get(marker["run"], 0.0) > now:
            return False  # one stall at a time per run: each long one is one alarm
        long = bool(pick % 2)
        seconds = HANG_TIMEOUT_S + 10.0 if long else 3.0 + pick % 5
        self.stall_until[marker["run"]] = now + seconds + 30.0  # and the restart after it
        where = "before_all_reduce" if pick % 4 < 2 else "after_all_reduce"
        path = Path(stall_file(str(self.ledger_dir), int(marker["pid"])))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"s": seconds, "where": where}))
        self.stalls["long" if long else "short"] += 1
        log(
            f"user thread stall: pid {marker['pid']} (run {marker['run']}) sleeps {seconds:.0f} s {where}"
        )
        return True

    def hang_alarms(self) -> str:
        """How often the watchdog fired (the drivers' "stuck at" lines) for the stalls."""
        fired = 0
        for job in self.jobs:
            for path in sorted(job.log_dir.glob("*")) if job.log_dir.is_dir() else []:
                with contextlib.suppress(OSError):
                    text = path.read_text(errors="replace")
                    fired += len(_WATCHDOG_LINE.findall(text))
        started = []  # the stalls that began (a worker replaced first never reads its file)
        with contextlib.suppress(OSError, ValueError):
            lines = (self.ledger_dir / "stall" / "started.jsonl").read_text().splitlines()
            started = [json.loads(line) for line in lines if line.strip()]
        long = sum(1 for s in started if float(s["s"]) > HANG_TIMEOUT_S)
        short = len(started) - long
        return (
            f"hang watchdog: fired {fired} time(s) for {long} long and {short} short "
            f"user-thread stalls that began (asked: {self.stalls['long']} long, "
            f"{self.stalls['short']} short); false alarms: {max(0, fired - long)}"
        )

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

    def _fault_s3_restart_in_multipart(self, pick: int, now: float) -> bool:
        if self.s3 is None or not any(
            j.storage == "s3" and j.kind == "train" for j in self.live_jobs()
        ):
            return False
        if any(w["kind"] == "s3_restart_in_multipart" for w in self.watches):
            return False
        self._watch("s3_restart_in_multipart", None, now, pick=pick)
        return True

    def _watch_s3_restart_in_multipart(self, w: dict[str, Any], now: float) -> bool:
        from soak_traps import multipart_uploads

        if self.s3.server is None:  # down already (another restart): wait for it
            return False
        uploads = [u for u in multipart_uploads(self.s3.bucket) if u[2] >= 1]
        if not uploads:
            return False
        key, upload_id, parts = uploads[0]
        self.s3.stop()
        down = 1 + w["pick"] % 3
        log(
            f"S3 server restart during a multipart upload: s3://{self.s3.bucket}/{key} "
            f"(upload {upload_id[:12]}, {parts} part(s) received of {len(uploads)} upload(s) "
            f"in progress); server down for {down} s"
        )
        self._schedule(now + down, "s3_start", None)
        self.faults["s3_restart_in_multipart"] += 1
        return True

    def _watch(self, kind: str, job: Job | None, now: float, **extra: Any) -> dict[str, Any]:
        w = {
            "kind": kind,
            "job": job,
            "since": time.time(),
            "until": now + WATCH_S.get(kind, WATCH_DEFAULT_S),
            **extra,
        }
        self.watches.append(w)
        return w

    def _watched(self, job: Job) -> bool:
        return any(w["job"] is job for w in self.watches)


class Faults(WorkerFaults):
    """Plain driver kills, storage errors, the watched kills of the first soak, and the
    machinery of every fault: targets, watches, follow-ups."""

    jobs: list[Job]
    workdir: Path

    def launch(self, job: Job) -> None:
        raise NotImplementedError

    def _storage_faults(self, settings: dict[str, Any]) -> None:
        raise NotImplementedError

    storage_errors_until: float
    _stamp_fs: Any = None

    def driver_targets(self, train_only: bool = False) -> list[Job]:
        """Live jobs whose driver no other fault owns, by name."""
        live = [
            j
            for j in self.live_jobs()
            if j.held_by is None and (j.kind == "train" or not train_only)
        ]
        return sorted(live, key=lambda j: j.name)

    def _kill_driver(self, job: Job, what: str, holder: str | None = None) -> bool:
        proc = job.proc
        if proc is None or proc.poll() is not None or job.held_by not in (None, holder):
            return False
        job.killed_by_us = True
        proc.send_signal(signal.SIGKILL)
        log(f"{what}: {job.name} (pid {proc.pid}, start {job.starts})")
        return True

    def _fault_driver_kill(self, pick: int, now: float) -> bool:
        live = self.driver_targets()
        if not live:
            return False
        return self._kill_driver(live[pick % len(live)], "driver SIGKILL")

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

    # -- watched kills ------------------------------------------------------------------------
    def _arm(self, kind: str, pick: int, now: float, train_only: bool, **extra: Any) -> bool:
        live = [j for j in self.driver_targets(train_only) if not self._watched(j)]
        if not live:
            return False
        job = live[pick % len(live)]
        self._watch(kind, job, now, pick=pick, **extra)
        return True

    def _fault_kill_in_upload(self, pick: int, now: float) -> bool:
        return self._arm("kill_in_upload", pick, now, train_only=False)

    def _watch_kill_in_upload(self, w: dict[str, Any], now: float) -> bool:
        for m in self._markers(w["job"]):
            if m["doing"] == "checkpoint" and m["t"] >= w["since"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(m["pid"]), signal.SIGKILL)
                    log(
                        f"worker SIGKILL in checkpoint upload: pid {m['pid']} ({m['run']} step {m['step']})"
                    )
                    self.faults["kill_in_upload"] += 1
                return True
        return False

    def _fault_driver_kill_in_state_write(self, pick: int, now: float) -> bool:
        live = [j for j in self.driver_targets(train_only=True) if not self._watched(j)]
        if not live:
            return False
        job = live[pick % len(live)]
        self._watch("driver_kill_in_state_write", job, now, first=self._state_stamp(job))
        return True

    def _watch_driver_kill_in_state_write(self, w: dict[str, Any], now: float) -> bool:
        job = w["job"]
        stamp = self._state_stamp(job)
        if stamp is None or str(stamp).startswith("error") or stamp == w["first"]:
            return False
        seen = "temp file seen" if stamp == "tmp" else "state changed"
        if self._kill_driver(job, f"driver SIGKILL in state write ({seen})"):
            self.faults["driver_kill_in_state_write"] += 1
        return True

    def _state_dir(self, job: Job) -> str:
        return f"{job.spec['storage_path']}/{job.name}/_lumos"

    def harness_fs(self) -> Any:
        """The harness's own S3 filesystem (plain s3fs, no injected faults), made once."""
        if self._stamp_fs is None:
            self._stamp_fs = self.s3.fs()
        return self._stamp_fs

    def _state_stamp(self, job: Job) -> Any:
        if job.storage == "local":
            state_dir = Path(self._state_dir(job))
            with contextlib.suppress(OSError):
                if any(".tmp-" in n for n in os.listdir(state_dir)):
                    return "tmp"
                return os.stat(state_dir / "run_state.json").st_mtime_ns
            return None
        try:
            info = self.harness_fs().info(f"{self._state_dir(job)[5:]}/run_state.json")
        except Exception as exc:  # the server is down, or no state yet
            return f"error {type(exc).__name__}"
        return info.get("ETag")

    def _state_summary(self, job: Job) -> str:
        """What the run state says now (for the log of a kill)."""
        from lumos.storage import RunStorage

        fs = None if job.storage == "local" else self.harness_fs()
        try:
            state = RunStorage(job.spec["storage_path"], job.name, fs).load_state()
        except Exception as exc:
            return f"run state unreadable ({type(exc).__name__}: {exc})"
        if state is None:
            return "no run state yet"
        pending = [c.dir_name for c in state.checkpoints if c.validation_status == "pending"]
        return (
            f"run state: status {state.status}, latest {state.latest_checkpoint}, "
            f"validations pending {pending}"
        )

    def end_watch(self, w: dict[str, Any]) -> None:
        """Undo what a watch set up (the inotify thread, moto's put trap)."""
        if w.get("trap") is not None:
            w["trap"].stop()
        if w.get("key"):
            from soak_traps import set_put_trap

            set_put_trap(w["key"], None)

    # -- the watches ----------------------------------------------------------------------------
    def poll_watches(self, now: float) -> None:
        for w in list(self.watches):
            job = w["job"]
            # A watched kill ends with its job; the lease and disk faults end themselves.
            ended = job is not None and job.done and w["kind"] in WATCHED
            held = job is not None and job.held_by not in (None, w["kind"])
            try:
                # Not while another fault owns the driver (a full disk, a stall).
                hit = False if held else getattr(self, f"_watch_{w['kind']}")(w, now)
            except Exception as exc:
                log(f"watch {w['kind']} failed: {type(exc).__name__}: {exc}")
                hit = False
            if hit:
                self.watches.remove(w)
                self.end_watch(w)
            elif ended or now > w["until"]:
                where = f" on {job.name}" if job is not None else ""
                log(f"{w['kind']}: nothing to hit in time{where}")
                if w["kind"] in WATCHED:
                    self.skipped[w["kind"]] += 1
                if job is not None and job.held_by == w["kind"]:
                    job.held_by = None
                self.watches.remove(w)
                self.end_watch(w)

    def watch_interval(self) -> float:
        """How long the main loop sleeps: short while a watch waits for a brief moment."""
        fast = {"kill_in_upload", "driver_kill_in_state_write", "s3_restart_in_multipart"}
        if any(w["kind"] in fast for w in self.watches):
            return 0.005
        return 0.02 if self.watches else 0.1

    def follow_up(self, what: str, arg: Any, now: float) -> None:
        """An event a fault scheduled (SIGCONT, a node back, the S3 server back ...)."""
        if what == "sigcont":
            with contextlib.suppress(ProcessLookupError):
                os.kill(arg, signal.SIGCONT)
            self.stopped_pids.discard(arg)
            log(f"worker SIGCONT: pid {arg}")
        elif what == "add_node":
            add_node(self.cluster)
            log("node added")
        elif what == "remove_drained":
            if arg in self.cluster.worker_nodes:
                self.cluster.remove_node(arg, allow_graceful=False)
            add_node(self.cluster)
            log("drained node removed, a new node added")
        elif what == "s3_start":
            if self.s3.server is None:
                self.s3.start()
                log("S3 server up")
        elif what == "storage_errors_off" and now >= self.storage_errors_until:
            self._storage_faults({"enabled": False})
            log("storage errors off")
