"""The soak's driver faults at the phase boundaries of a Train run, a stall past the
lease's TTL (with and without a second driver), and a full disk. Mixed into
``soak.Harness`` over ``soak_faults.Faults``; each logs when it fired and on what."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from soak_config import (
    DISK_FULL_FAIL_S,
    LEASE_TTL_S,
    STALE_DRIVER_MAX_S,
    TAKEOVER_WAIT_S,
    Exit,
    Job,
    log,
)
from soak_faults import Faults

#: The run's own status in a state file (``model_dump_json(indent=1)``: top-level keys are
#: indented by one space; an attempt's ``"status": "finished"`` sits deeper).
FINISHED = re.compile(rb'\n "status": "finished"')
WAITING_LINE = "training finished; waiting for"


class DriverFaults(Faults):
    """Train drivers killed after training, in the final validation, in the final state
    write; stopped past their lease; on a disk that fills up."""

    # -- phase boundaries: after training, during validation, in the final state write ---------
    def _fault_driver_kill_after_training(self, pick: int, now: float) -> bool:
        return self._arm("driver_kill_after_training", pick, now, train_only=True)

    def _watch_driver_kill_after_training(self, w: dict[str, Any], now: float) -> bool:
        job: Job = w["job"]
        directory = self.ledger_dir / "markers" / job.name
        done = []
        for rank in (0, 1):
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads((directory / f"rank{rank}.json").read_text())
                if doc["doing"] == "done" and doc["t"] >= w["since"]:
                    done.append(rank)
        if len(done) < 2:
            return False
        if self._kill_driver(job, "driver SIGKILL after training finished (both ranks returned)"):
            self.faults["driver_kill_after_training"] += 1
            log(f"  {job.name} when killed: {self._state_summary(job)}")
        return True

    def _fault_driver_kill_in_validation(self, pick: int, now: float) -> bool:
        live = [j for j in self.driver_targets(train_only=True) if not self._watched(j)]
        if not live:
            return False
        job = live[pick % len(live)]
        path = job.log_path
        offsets = {path: path.stat().st_size if path.exists() else 0}  # lines from now on
        self._watch("driver_kill_in_validation", job, now, pick=pick, logs=offsets)
        return True

    def _watch_driver_kill_in_validation(self, w: dict[str, Any], now: float) -> bool:
        job: Job = w["job"]
        path = job.log_path  # a start after the watch was armed: its log from the beginning
        offset = w["logs"].get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        lines = [line for line in text.splitlines() if WAITING_LINE in line]
        w["logs"][path] = offset + len(text.encode())
        if not lines:
            return False
        marker = self.ledger_dir / "markers" / job.name / "validation.json"
        running = "no validation marker"
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(marker.read_text())
            running = f"validation of {doc['ckpt']} {doc['doing']} (pid {doc['pid']})"
        if self._kill_driver(job, "driver SIGKILL during the final validation"):
            self.faults["driver_kill_in_validation"] += 1
            log(f"  the driver had said: {lines[-1].strip()!r}; {running}")
        return True

    def _fault_driver_kill_in_final_write(self, pick: int, now: float) -> bool:
        live = [j for j in self.driver_targets(train_only=True) if not self._watched(j)]
        if not live:
            return False
        job = live[pick % len(live)]
        if job.storage == "local" and not Path(self._state_dir(job)).is_dir():
            return False  # the run has no state directory yet
        w = self._watch("driver_kill_in_final_write", job, now, pick=pick, hit=None)
        if job.storage == "local":
            from soak_traps import InotifyTrap

            w["trap"] = InotifyTrap(
                Path(self._state_dir(job)), lambda n, d: self._final_local(w, n, d)
            )
        else:
            from soak_traps import set_put_trap

            key = f"{self._state_dir(job)[5:]}/run_state.json"
            w["key"] = key
            set_put_trap(key, lambda body: self._final_s3(w, body))
        return True

    def _final_local(self, w: dict[str, Any], name: str, data: bytes) -> bool:
        """In the inotify thread: a state file with status finished is being written."""
        if not FINISHED.search(data):
            return False
        if name.startswith(".run_state.json.tmp-"):
            how = "in the write: its temp file holds status finished, not yet renamed"
        elif name == "run_state.json":
            how = "right after the write: run_state.json says finished, the driver had not exited"
        else:
            return False
        w["hit"] = (self._kill_driver(w["job"], "driver SIGKILL in the final state write"), how)
        return True

    def _final_s3(self, w: dict[str, Any], body: bytes | None) -> str | None:
        """In moto's request thread: the PUT of a run state with status finished
        (``body`` None: the PUT this trap let through has been stored)."""
        if body is None:
            w["landed"] = True
            return None
        if not FINISHED.search(body):
            return None
        land = w["pick"] % 2 == 0
        how = (
            "in the PUT: the server stored the state, the driver never got the answer"
            if land
            else "in the PUT: the driver died before the server stored it (the write is lost)"
        )
        w["hit"] = (self._kill_driver(w["job"], "driver SIGKILL in the final state write"), how)
        return "land" if land else "drop"

    def _watch_driver_kill_in_final_write(self, w: dict[str, Any], now: float) -> bool:
        if w["hit"] is None:
            return False
        if "land" in w["hit"][1] and not w.get("landed") and now < w["until"]:
            return False  # the PUT is being stored: read the state after it
        killed, how = w["hit"]
        if killed:
            self.faults["driver_kill_in_final_write"] += 1
            log(f"  {w['job'].name}: {how}; after the kill: {self._state_summary(w['job'])}")
        return True

    # -- a stall past the lease's TTL -----------------------------------------------------------
    def _lease_doc(self, job: Job) -> dict[str, Any] | None:
        path = f"{self._state_dir(job)}/lease.json"
        try:
            if job.storage == "local":
                data = Path(path).read_bytes()
            else:
                data = self.harness_fs().cat_file(path[5:])
            return dict(json.loads(data))
        except Exception:
            return None

    def _fault_driver_stall_past_lease(self, pick: int, now: float) -> bool:
        live = self.driver_targets(train_only=True)  # (other watches wait while it is held)
        if not live:
            return False
        job = live[pick % len(live)]
        assert job.proc is not None
        lease = self._lease_doc(job)
        if lease is None or int(lease.get("pid", -1)) != job.proc.pid:
            return False  # the driver holds no lease yet
        takeover = pick % 2 == 0
        job.held_by = "driver_stall_past_lease"
        proc = job.proc
        os.kill(proc.pid, signal.SIGSTOP)
        self.stopped_pids.add(proc.pid)
        stop_s = LEASE_TTL_S + (1.0 if takeover else 5.0 + pick % 6)
        then = (
            f"a second driver starts in {stop_s:.0f} s"
            if takeover
            else f"SIGCONT in {stop_s:.0f} s, no other driver"
        )
        log(
            f"driver SIGSTOP past its lease (ttl {LEASE_TTL_S:.0f} s, last renewed "
            f"{time.time() - float(lease.get('acquired_at', 0)):.1f} s ago): {job.name} "
            f"(pid {proc.pid}, start {job.starts}); {then}"
        )
        w = self._watch("driver_stall_past_lease", job, now, phase="stopped", at=now + stop_s)
        w.update(proc=proc, start=job.starts, takeover=takeover, until=float("inf"))
        return True

    def _watch_driver_stall_past_lease(self, w: dict[str, Any], now: float) -> bool:
        job: Job = w["job"]
        phase = w["phase"]
        if phase == "stopped" and now >= w["at"]:
            if not w["takeover"]:
                self._cont(w, "nobody took the lease over; its next renewal comes late")
                job.held_by = None
                return True
            job.takeover = {"stale_pid": w["proc"].pid, "stale_start": w["start"], "at": None}
            job.proc = None  # the stopped one stays in w["proc"]
            self.launch(job)
            job.takeover["start"] = job.starts
            w.update(phase="waiting", at=now + TAKEOVER_WAIT_S)
            log(
                f"a second driver for {job.name} (start {job.starts}) while pid {w['proc'].pid} is stopped"
            )
        elif phase == "waiting":
            if now < w.get("next_look", 0.0):
                return False
            w["next_look"] = now + 0.5
            lease = self._lease_doc(job)
            current = job.proc.pid if job.proc is not None else None
            if lease is not None and current is not None and int(lease.get("pid", -1)) == current:
                job.takeover.update(at=time.time(), pid=current, start=job.starts)
                log(f"lease of {job.name} taken over by pid {current} (start {job.starts})")
                w.update(phase="taken", at=now + 3.0)
            elif now >= w["at"]:
                log(f"no takeover of {job.name}'s lease in {TAKEOVER_WAIT_S:.0f} s; lease: {lease}")
                job.takeover["no_takeover"] = f"lease after {TAKEOVER_WAIT_S:.0f} s: {lease}"
                w.update(phase="taken", at=now)
        elif phase == "taken" and now >= w["at"]:
            self._cont(w, "its lease belongs to the second driver now")
            job.takeover["cont_at"] = time.time()
            w.update(phase="resumed", at=now + STALE_DRIVER_MAX_S)
        elif phase == "resumed":
            rc = w["proc"].poll()
            if rc is None and now < w["at"]:
                return False
            if rc is None:
                w["proc"].kill()
                rc = w["proc"].wait()
                job.takeover["stale_end"] = (
                    f"still running {STALE_DRIVER_MAX_S:.0f} s after SIGCONT: killed"
                )
            else:
                job.takeover["stale_end"] = f"exited {rc}"
            job.takeover["stale_rc"] = rc
            job.exits.append(Exit(w["start"], rc, job.log_at(w["start"]), "stale"))
            log(f"stale driver of {job.name} (pid {w['proc'].pid}): {job.takeover['stale_end']}")
            job.held_by = None
            return True
        return False

    def _cont(self, w: dict[str, Any], why: str) -> None:
        pid = w["proc"].pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.stopped_pids.discard(pid)
        log(
            f"driver SIGCONT: {w['job'].name} (pid {pid}) after {time.time() - w['since']:.0f} s; {why}"
        )

    # -- a full disk ----------------------------------------------------------------------------
    def _fault_disk_full(self, pick: int, now: float) -> bool:
        """Armed: the next local Train run on a tmpfs with 8 steps to go gets a full disk."""
        if any(w["kind"] == "disk_full" and w["job"] is None for w in self.watches):
            return False  # one is waiting for a target already
        self._watch("disk_full", None, now, pick=pick)
        return True

    def _fill_disk(self, w: dict[str, Any], now: float) -> bool:
        live = [
            j
            for j in self.driver_targets(train_only=True)
            if j.disk is not None and j.disk_full is None and self._steps_left(j) >= 8
        ]
        if not live:
            return False
        job = live[w["pick"] % len(live)]
        job.held_by = "disk_full"
        filled = job.disk.fill()
        job.disk_full = {
            "at": time.time(),
            "start": job.starts,
            "filled": filled,
            "free": job.disk.free_bytes(),
            "outcome": None,
        }
        log(
            f"disk full: {job.disk.path} (tmpfs {job.disk.size}) of {job.name} (start {job.starts}): "
            f"{filled / 2**20:.1f} MiB filler written until ENOSPC, {job.disk.free_bytes()} bytes free"
        )
        self.faults["disk_full"] += 1
        # It ends itself: the driver's exit, or the deadline.
        w.update(job=job, deadline=now + DISK_FULL_FAIL_S, until=float("inf"))
        return True

    def _steps_left(self, job: Job) -> int:
        steps = [int(m["step"]) for m in self._markers(job) if m["doing"] in ("step", "checkpoint")]
        if not steps:
            return 0
        return int(job.spec["loop"]["steps"]) - max(steps)

    def disk_full_exit(self, job: Job, rc: int) -> str | None:
        """A driver on a full disk ended: record it, free the space; the exit's reason."""
        df = job.disk_full
        if df is None or df["outcome"] is not None:
            return None
        df["outcome"] = {"rc": rc, "start": job.starts, "log": str(job.log_path)}
        job.disk.free()
        job.held_by = None
        free = job.disk.free_bytes() // 2**20
        log(f"{job.name} on the full disk ended with status {rc}; space freed ({free} MiB free)")
        return "planned: disk full" if rc != 0 else None

    def _watch_disk_full(self, w: dict[str, Any], now: float) -> bool:
        if w["job"] is None:
            self._fill_disk(w, now)
            return False
        job: Job = w["job"]
        df = job.disk_full
        assert df is not None
        if df["outcome"] is not None:
            return True
        if now < w["deadline"]:
            return False
        df["outcome"] = {"rc": None, "start": job.starts, "log": str(job.log_path)}
        job.disk.free()
        job.held_by = None
        log(
            f"{job.name} still running {DISK_FULL_FAIL_S:.0f} s after its disk filled up; space freed"
        )
        return True
