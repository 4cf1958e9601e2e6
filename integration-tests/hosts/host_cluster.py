"""A Ray cluster and an S3 server on the hosts of ``hosts.py``, with drivers on them.

Roles (``HostCluster``):

* ``h0`` the Ray head (2 CPUs), ``h1`` and ``h2`` Ray workers (2 CPUs each);
* ``h3`` the driver's host: a Ray node with no CPUs (a user's login or head box
  running no training), where the scenarios' drivers run;
* ``h4`` the S3 host (moto's server), running no Ray;
* ``h5`` a spare host that joins the cluster when a scenario asks;
* ``h6`` a host that runs nothing but ``lumos ls`` / ``lumos show``; its hostname is the
  driver host's (``lumos-h3``), as when two machines share one.

The drivers are ``host_driver.py`` processes (so a test can SIGKILL one); the test
follows their progress in the events file each writes (one line per report).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hosts import STATE_DIR, Host, Hosts

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "host_driver.py"
PROBE = HERE / "host_probe.py"
SWEEP = HERE / "host_sweep.py"
N_HOSTS = 7
HEAD, WORKERS, DRIVER_HOST, S3_HOST, SPARE, OBSERVER = 0, (1, 2), 3, 4, 5, 6
CPUS = 2
BUCKET = "lumos-hosts"


def result_line(output: str) -> Any:
    """The JSON after the last ``RESULT `` line of a driver's or probe's output."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise AssertionError(f"no RESULT line in:\n{output[-6000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


@dataclass
class Driver:
    """One ``host_driver.py`` process on a host."""

    host: Host
    config: dict[str, Any]
    log: Path
    events: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    def rows(self) -> list[dict[str, Any]]:
        """The reports rank 0 made so far (the events file)."""
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines() if line]

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(
        self, what: str, condition: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 240
    ) -> list[dict[str, Any]]:
        """Poll the events until ``condition(rows)``; fail with the driver's output."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows()
            if condition(rows):
                return rows
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited ({self.proc.returncode})"
                    if self.proc.poll() is not None
                    else "timed out"
                )
                raise AssertionError(f"driver {why} before {what}:\n{self.output()[-6000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL the driver (its process on the host, not only ``nsenter``)."""
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)

    def result(self, timeout_s: float = 300) -> Any:
        """Wait for the driver to end; its RESULT."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"driver still running after {timeout_s:.0f} s:\n{self.output()[-6000:]}"
            ) from exc
        return result_line(self.output())


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, then theirs)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                kids = [
                    int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()
                ]
                out.extend(kids)
                todo.extend(kids)
    return out


class HostCluster:
    """Ray on h0-h3, S3 on h4 (see the module docstring)."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.address = ""
        self.endpoint = ""
        self.finished_runs: list[str] = []  # runs the scenarios finished (for lumos ls)

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def start(self) -> None:
        """Head first, then the other nodes in parallel, then S3 and its bucket."""
        h = self.hosts
        self.address = h.ray_head(h[HEAD], num_cpus=CPUS)
        self.join(*[h[i] for i in WORKERS], (h[DRIVER_HOST], 0))
        self.endpoint = h.s3(h[S3_HOST])
        make = f"from lumos.storage.testing import s3_filesystem as f; f({self.endpoint!r}).mkdir({BUCKET!r})"
        done = h[S3_HOST].run([sys.executable, "-c", make])
        assert done.returncode == 0, done.stderr

    def join(self, *hosts: Host | tuple[Host, int]) -> None:
        """``ray start --address`` on each host at once (``(host, cpus)`` for other CPUs)."""
        import threading

        errors: list[BaseException] = []

        def one(item: Host | tuple[Host, int]) -> None:
            host, cpus = item if isinstance(item, tuple) else (item, CPUS)
            try:
                self.hosts.ray_join(host, self.address, num_cpus=cpus)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(item,)) for item in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def nodes(self) -> list[dict[str, Any]]:
        """The alive Ray nodes (``ip``, ``node_id``, ``cpus``), asked from the driver host."""
        done = self[DRIVER_HOST].run([sys.executable, str(PROBE), "nodes", self.address])
        assert done.returncode == 0, done.stderr[-3000:]
        nodes: list[dict[str, Any]] = result_line(done.stdout)
        return nodes

    def wait_nodes(self, ips: set[str], timeout_s: float = 120) -> None:
        """Until the alive nodes are exactly ``ips``."""
        deadline = time.monotonic() + timeout_s
        while True:
            alive = {n["ip"] for n in self.nodes()}
            if alive == ips:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"alive nodes {sorted(alive)}, expected {sorted(ips)}")
            time.sleep(2)

    def drain(self, index: int, deadline_s: float = 60) -> dict[str, Any]:
        """A preemption notice for host ``index``'s Ray node (``GcsClient.drain_node``)."""
        host = self[index]
        command = [sys.executable, str(PROBE), "drain", self.address, host.address, str(deadline_s)]
        done = self[DRIVER_HOST].run(command)
        assert done.returncode == 0, done.stderr[-3000:]
        out: dict[str, Any] = result_line(done.stdout)
        return out

    def ray_ips(self) -> set[str]:
        """The addresses of the hosts that run Ray between scenarios."""
        return {self[i].address for i in (HEAD, *WORKERS, DRIVER_HOST)}

    def restart_host(self, index: int, join: bool = True) -> None:
        """Kill everything on a host, boot it afresh and (with ``join``) rejoin Ray."""
        host = self[index]
        host.kill_all()
        host.boot()
        if join:
            self.join(host)

    def restore(self) -> None:
        """Bring the cluster back to its roles after a scenario lost or added hosts."""
        for host in self.hosts.hosts:
            host.set_link(True)  # a partition a failed scenario left behind
        alive = {n["ip"] for n in self.nodes()}
        for index in WORKERS:
            if self[index].address not in alive or not self[index].up:
                self.restart_host(index)
        if self[SPARE].address in alive:
            self.restart_host(SPARE, join=False)
        self.wait_nodes(self.ray_ips())

    def driver(self, name: str | None = None, host: int = DRIVER_HOST, **config: Any) -> Driver:
        """Start ``host_driver.py fit`` on ``host`` for run ``name`` (unique when None)."""
        name = name or f"run-{uuid.uuid4().hex[:8]}"
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        events, log = STATE_DIR / f"{tag}.events.jsonl", STATE_DIR / f"{tag}.log"
        full = {
            "address": self.address,
            "endpoint": self.endpoint,
            "bucket": BUCKET,
            "name": name,
            "events": str(events),
            **config,
        }
        proc = self[host].popen([sys.executable, str(DRIVER), "fit", json.dumps(full)], log)
        return Driver(self[host], full, log, events, proc)

    def sweep(self, name: str, host: int = DRIVER_HOST, **config: Any) -> Driver:
        """Start ``host_sweep.py`` (a Tune-over-Train sweep) on ``host``."""
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        full = {"address": self.address, "endpoint": self.endpoint, "bucket": BUCKET, "name": name}
        full.update(config)
        log = STATE_DIR / f"{tag}.log"
        proc = self[host].popen([sys.executable, str(SWEEP), json.dumps(full)], log)
        return Driver(self[host], full, log, Path(str(config["progress"])), proc)

    def try_lease(self, name: str, host: int) -> dict[str, Any]:
        """Try to take run ``name``'s lease on ``host`` (what a second driver does first)."""
        config = {"endpoint": self.endpoint, "bucket": BUCKET, "name": name}
        done = self[host].run([sys.executable, str(DRIVER), "lease", json.dumps(config)])
        assert done.returncode == 0, done.stderr[-3000:]
        out: dict[str, Any] = result_line(done.stdout)
        return out

    def state(self, name: str, host: int = OBSERVER) -> dict[str, Any]:
        """The stored state of run ``name``, read from S3 on ``host``."""
        config = {"endpoint": self.endpoint, "bucket": BUCKET, "name": name}
        done = self[host].run([sys.executable, str(DRIVER), "state", json.dumps(config)])
        assert done.returncode == 0, done.stderr[-3000:]
        out: dict[str, Any] = result_line(done.stdout)
        return out

    def lumos(self, *args: str, host: int = OBSERVER) -> subprocess.CompletedProcess[str]:
        """The ``lumos`` command on ``host``, with the S3 endpoint and moto's dummy keys."""
        env = {
            "AWS_ACCESS_KEY_ID": "lumos-testing",
            "AWS_SECRET_ACCESS_KEY": "lumos-testing-secret",
            "AWS_DEFAULT_REGION": "us-west-2",
        }
        command = [
            str(Path(sys.executable).parent / "lumos"),
            *args,
            "--endpoint-url",
            self.endpoint,
        ]
        return self[host].run(command, env=env, timeout=120)
