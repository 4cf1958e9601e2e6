"""A cluster of real hosts on one Linux machine: network namespaces on a bridge.

Each host is a network namespace ``lumos-h<i>`` with its own interfaces, addresses,
ports and routes; the hosts share the machine's filesystem and process table only.

* ``eth1`` is a veth joined to the bridge ``lumos-br0`` in the root namespace, with
  ``10.213.7.<10+i>/24``: the hosts' network. The root namespace has no address on
  it, so nothing outside the namespaces is a target and the hosts reach nothing else.
* ``eth0`` (the lower interface index) is a decoy "management" veth with
  ``10.213.8.<10+i>/24`` whose far end is unconnected: it reaches no other host, so a
  process that picks "the first interface" instead of the one that reaches its peers
  fails here as on a real multi-NIC host.
* Each host also has its own PID, mount and UTS namespaces: its hostname is its
  namespace's name, its ``/etc/hosts`` maps that name to 127.0.1.1 (as Debian's
  installer writes it), so anything that binds "the hostname's address" binds
  loopback, and its processes see only each other (Ray finds "the local raylet" by
  listing processes: on a shared process table a driver would attach to another
  host's raylet). The host's PID 1 is a ``sleep``; killing it kills every process on
  the host at once, as when a machine dies.

``Hosts`` builds them and always tears them down: every process in each namespace is
killed (``ip netns pids``), then the veths, the bridge and the namespaces are deleted,
on exit from the ``with`` block, at interpreter exit and on SIGTERM/SIGHUP. Leftovers
of an earlier run that was SIGKILLed are removed at the start. One harness at a time
on a machine (a lock file).

Ray on the hosts is started with ``ray start`` in the namespace, bound to the host's
address (``--node-ip-address``), with its own ``--temp-dir``. ``ray stop`` is never
used: it kills every Ray process on the machine, the other hosts' and other test
sessions' included.

Every command runs under ``env -u GLOO_SOCKET_IFNAME -u NCCL_SOCKET_IFNAME -u
RAY_ADDRESS``: the harness sets no interface for anything it starts.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

SUBNET = "10.213.7"
"""The hosts' network (``/24``); used by nothing else on this machine."""

DECOY_SUBNET = "10.213.8"
"""The decoy interfaces' network: reaches no other host."""

NS_PREFIX = "lumos-h"
BRIDGE = "lumos-br0"
DATA_IF = "eth1"
DECOY_IF = "eth0"
RAY_PORT = 6379
S3_PORT = 5000
STATE_DIR = Path("/tmp/lumos-hosts")
LOCK_FILE = Path("/tmp/lumos-hosts.lock")
BIN = Path(sys.executable).parent
#: Environment variables nothing the harness starts may inherit.
UNSET = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "RAY_ADDRESS",
    "MASTER_ADDR",
    "MASTER_PORT",
    # the test sessions' loopback-only switch: with it, `ray start --address` refuses to join
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
)


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (the reason is the message)."""


RAY_START_ATTEMPTS = 3
RAY_NODE_START_TIMEOUT = "timed out during startup"
"""``ray start`` gives a new node a fixed 30 s to register with the GCS (Ray's own
limit, no setting): three hosts joining at once on a loaded machine (load 20 on 2 cores)
missed it. Only that failure is retried, on a host killed and booted clean."""


def unavailable_reason() -> str | None:
    """Why this machine cannot run the hosts harness, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"hosts harness: needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "hosts harness: needs root to create network namespaces (ip netns)"
    if shutil.which("ip") is None:
        return "hosts harness: needs the `ip` command (iproute2)"
    probe = f"{NS_PREFIX}probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"hosts harness: `ip netns add` failed: {made.stderr.strip()}"
    try:
        veth = _ip(
            "link", "add", "lumos-hprobe", "type", "veth", "peer", "name", "lumos-hprb", check=False
        )
        if veth.returncode != 0:
            return f"hosts harness: cannot create veth pairs: {veth.stderr.strip()}"
        _ip("link", "del", "lumos-hprobe", check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX)]


def _links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(NS_PREFIX) or n == BRIDGE]


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process in ``ns`` until none is left (bounded)."""
    for _ in range(50):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_all() -> None:
    """Delete every namespace, veth and bridge of this harness (idempotent)."""
    for ns in _namespaces():
        _kill_namespace_processes(ns)
    for link in _links():
        _ip("link", "del", link, check=False)
    for ns in _namespaces():
        _ip("netns", "del", ns, check=False)


@dataclass
class Host:
    """One namespace: a host with its own address, ports and processes."""

    index: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    init: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    init_pid: int = 0  # the host's PID 1, as this machine's process table names it
    hostname: str = ""  # default: the namespace's name

    @property
    def name(self) -> str:
        """The namespace's name, ``lumos-h<i>``."""
        return f"{NS_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        """The host's address on the hosts' network."""
        return f"{SUBNET}.{10 + self.index}"

    @property
    def decoy_address(self) -> str:
        """The decoy interface's address (reaches no other host)."""
        return f"{DECOY_SUBNET}.{10 + self.index}"

    @property
    def veth(self) -> str:
        """The root-namespace end of the host's link to the bridge."""
        return f"{self.name}-br"

    @property
    def temp_dir(self) -> Path:
        """This host's Ray ``--temp-dir`` and logs."""
        return STATE_DIR / f"h{self.index}"

    def boot(self) -> None:
        """Start the host's PID 1 (its own PID, mount and UTS namespaces in its netns)."""
        name = self.hostname or self.name
        hosts_file = self.temp_dir / "etc-hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n")
        script = f"hostname {name} && mount --bind {hosts_file} /etc/hosts && exec sleep infinity"
        self.init = subprocess.Popen(
            ["ip", "netns", "exec", self.name, "unshare", "--pid", "--fork", "--mount-proc",
             "--uts", "--kill-child", "sh", "-c", script],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = self._child_sleep(self.init.pid)
            if pid:
                self.init_pid = pid
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: its init process did not start")

    @staticmethod
    def _child_sleep(parent: int) -> int:
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
            for child in children:
                if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"):
                    return int(child)
        except OSError:
            pass
        return 0

    @property
    def up(self) -> bool:
        """Whether the host's PID 1 runs (a killed host is down until ``boot()``)."""
        return self.init is not None and self.init.poll() is None

    def argv(self, command: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        """``command`` as run on this host, with the harness's environment."""
        if not self.up:
            raise RuntimeError(f"{self.name} is down (boot() it first)")
        unset = [a for name in UNSET for a in ("-u", name)]
        base = {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
        pairs = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
        enter = ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "-u", "--"]
        return [*enter, "env", *unset, *pairs, *command]

    def run(
        self, command: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` here to the end; its output captured."""
        return subprocess.run(
            self.argv(command, env), capture_output=True, text=True, timeout=timeout
        )

    def popen(
        self, command: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` here in the background, stdout and stderr to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        out: IO[bytes] = log.open("ab")
        proc = subprocess.Popen(
            self.argv(command, env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()
        self.procs.append(proc)
        return proc

    def reap(self) -> None:
        """Wait for the processes this harness started here (after they were killed)."""
        for proc in [*self.procs, *([self.init] if self.init is not None else [])]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # `ip netns exec` / nsenter itself, outside the namespace
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.procs.clear()

    def pids(self) -> list[int]:
        """Every process in this namespace."""
        return [int(p) for p in _ip("netns", "pids", self.name, check=False).stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL every process on this host at once, as when the machine dies.

        Killing the host's PID 1 kills every process in its PID namespace; anything
        left in the network namespace is killed after. ``boot()`` brings it back.
        """
        if self.init_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        _kill_namespace_processes(self.name)
        self.reap()

    def set_link(self, up: bool) -> None:
        """Take the host's link to the bridge down (a partition) or bring it back."""
        _ip("link", "set", self.veth, "up" if up else "down")


class Hosts:
    """``n`` hosts on a bridge, torn down on exit however the block ends.

    Example:
        >>> with Hosts(4) as hosts:                          # doctest: +SKIP
        ...     head = hosts.ray_head(hosts[0])
        ...     hosts.ray_join(hosts[1], head)
    """

    def __init__(self, n: int, decoy: bool = True, hostnames: dict[int, str] | None = None) -> None:
        if not 1 <= n <= 40:
            raise ValueError(f"Hosts(n={n!r}): n must be 1..40")
        self.hosts = [Host(i, hostname=(hostnames or {}).get(i, "")) for i in range(n)]
        self.decoy = decoy
        self._lock: IO[str] | None = None
        self._old_handlers: dict[int, Any] = {}
        self._closed = True

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        self._lock = LOCK_FILE.open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock.close()
            self._lock = None
            raise HostsUnavailable(
                f"hosts harness: another one runs ({LOCK_FILE} is locked)"
            ) from exc
        self._closed = False
        atexit.register(self.close)
        self._install_signal_handlers()
        try:
            remove_all()  # leftovers of a run that was SIGKILLed
            shutil.rmtree(STATE_DIR, ignore_errors=True)
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("link", "set", BRIDGE, "up")
        for host in self.hosts:
            self._add_host(host)

    def _add_host(self, host: Host) -> None:
        ns = host.name
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        if self.decoy:  # created first: the lower interface index
            _ip("link", "add", f"{ns}-dc", "type", "veth", "peer", "name", f"{ns}-dn")
            _ip("link", "set", f"{ns}-dn", "netns", ns)
            _ip("-n", ns, "link", "set", f"{ns}-dn", "name", DECOY_IF)
            _ip("-n", ns, "addr", "add", f"{host.decoy_address}/24", "dev", DECOY_IF)
            _ip("-n", ns, "link", "set", DECOY_IF, "up")
            _ip("link", "set", f"{ns}-dc", "up")
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{ns}-ns")
        _ip("link", "set", f"{ns}-ns", "netns", ns)
        _ip("-n", ns, "link", "set", f"{ns}-ns", "name", DATA_IF)
        _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", DATA_IF)
        _ip("-n", ns, "link", "set", DATA_IF, "up")
        _ip("link", "set", host.veth, "master", BRIDGE, "up")
        # No default route: the hosts reach each other and nothing else.
        host.temp_dir.mkdir(parents=True, exist_ok=True)
        host.boot()

    def close(self) -> None:
        """Kill every process on the hosts; delete the namespaces, veths and bridge."""
        if self._closed:
            return
        self._closed = True
        try:
            remove_all()
            for host in self.hosts:
                host.reap()
        finally:
            self._restore_signal_handlers()
            with contextlib.suppress(Exception):
                atexit.unregister(self.close)
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def _install_signal_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # under nohup: keep ignoring it
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.close()  # restores the previous handlers
        signal.raise_signal(signum)

    # --- services on the hosts -------------------------------------------------

    def ray_head(self, host: Host, num_cpus: int = 2, **options: Any) -> str:
        """``ray start --head`` on ``host``; returns the cluster address ``ip:port``."""
        self._ray_start(host, ["--head", f"--port={RAY_PORT}"], num_cpus, options)
        return f"{host.address}:{RAY_PORT}"

    def ray_join(self, host: Host, address: str, num_cpus: int = 2, **options: Any) -> None:
        """``ray start --address=<head>`` on ``host``."""
        self._ray_start(host, [f"--address={address}"], num_cpus, options)

    def _ray_start(
        self, host: Host, role: list[str], num_cpus: int, options: dict[str, Any]
    ) -> None:
        args = [
            "ray",
            "start",
            *role,
            f"--node-ip-address={host.address}",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--object-store-memory={options.pop('object_store_memory', 150 * 1024 * 1024)}",
            f"--temp-dir={host.temp_dir}",
            "--disable-usage-stats",
        ]
        if "--head" in role:
            args.append("--include-dashboard=false")
        args += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        failures: list[str] = []
        for attempt in range(1, RAY_START_ATTEMPTS + 1):
            done = host.run(args, timeout=180)
            if done.returncode == 0:
                return
            output = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            failures.append(f"attempt {attempt} ({done.returncode}):\n{output}")
            if RAY_NODE_START_TIMEOUT not in output:
                break
            print(
                f"ray start on {host.name} {RAY_NODE_START_TIMEOUT} (attempt {attempt})",
                file=sys.stderr,
            )
            host.kill_all()  # what the failed start left running, then a clean host
            host.boot()
        raise RuntimeError(f"ray start on {host.name} failed:\n" + "\n".join(failures))

    def s3(self, host: Host) -> str:
        """moto's S3 server on ``host``; returns its endpoint URL."""
        proc = host.popen(
            ["moto_server", "-H", host.address, "-p", str(S3_PORT)],
            STATE_DIR / f"s3-{host.name}.log",
        )
        url = f"http://{host.address}:{S3_PORT}"
        probe = (
            "import socket,sys,time\n"
            "d=time.monotonic()+60\n"
            "while time.monotonic()<d:\n"
            f"    try: socket.create_connection(({host.address!r},{S3_PORT}),1).close(); sys.exit(0)\n"
            "    except OSError: time.sleep(0.2)\n"
            "sys.exit(1)\n"
        )
        if (
            host.run([sys.executable, "-c", probe], timeout=90).returncode != 0
            or proc.poll() is not None
        ):
            raise RuntimeError(f"moto S3 server on {host.name} did not start; see {STATE_DIR}")
        return url


@contextlib.contextmanager
def hosts(n: int, decoy: bool = True) -> Iterator[Hosts]:
    """``with hosts(4) as h: ...``: the same as ``with Hosts(4) as h``."""
    with Hosts(n, decoy=decoy) as made:
        yield made


if __name__ == "__main__":
    # `python hosts.py`: "ok" when the harness can run here, else the reason (nox -s hosts).
    print(unavailable_reason() or "ok")
