"""The network interface a rank's process group uses: the one holding its Ray node IP.

Without ``GLOO_SOCKET_IFNAME`` gloo binds the address the machine's hostname
resolves to. On many hosts that is loopback (Debian writes ``127.0.1.1 <hostname>``
into ``/etc/hosts``; containers often map the hostname to 127.0.0.1), and gloo then
tells the peers on other hosts to connect to 127.0.1.1: the group never forms. NCCL
without ``NCCL_SOCKET_IFNAME`` takes the first interface that is not loopback or
docker, which on a host with several networks may be one that does not reach rank 0.

Ray already knows the address every host is reached at: the node IP each worker's
raylet was started with (``ray start --node-ip-address``, or the address that routes
to the head). So, unless the user set the variable, each rank sets
``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME`` for nccl) to the interface that holds
its node IP. When no interface holds it (a NAT'd address) and the group spans
hosts, the rank fails at once with an error naming the variable to set.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from collections.abc import MutableMapping

from lumos.train._internal.errors import TrainConfigError

SOCKET_IFNAME_VARS = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
"""The environment variable that picks each backend's network interface."""

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

# The values this process set (variable -> value): any other value is the user's.
_ours: dict[str, str] = {}


def interface_addresses() -> dict[str, str]:
    """Every address of this host's network interfaces -> the interface's name (Linux).

    IPv4 addresses come from ``ioctl(SIOCGIFADDR)`` (one per interface), IPv6 ones
    from ``/proc/net/if_inet6``. Elsewhere (no ``fcntl`` / ``/proc``) the map is empty.
    """
    found: dict[str, str] = {}
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address (or not a Linux ioctl)
            found[socket.inet_ntoa(reply[20:24])] = name
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6:
                found[str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))] = fields[5]
    return found


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address``, or None."""
    try:
        wanted = str(ipaddress.ip_address(address))
    except ValueError:
        return None  # a hostname, not an address
    return interface_addresses().get(wanted)


def choose_socket_interface(
    backend: str,
    node_ip: str,
    master_addr: str,
    multi_host: bool,
    rank: int,
    environ: MutableMapping[str, str] | None = None,
) -> str | None:
    """Point ``backend`` at the interface holding ``node_ip`` unless the user chose one.

    Args:
        backend: ``"gloo"`` or ``"nccl"`` (another backend: nothing is set).
        node_ip: this worker's Ray node IP.
        master_addr: rank 0's address (for the error message).
        multi_host: whether the group's workers are on more than one node.
        rank: this worker's rank (for the error message).
        environ: the environment to read and set (default ``os.environ``).

    Returns:
        The interface set, or None when nothing was set (the user's setting, a
        backend without one, or a single-host group whose address no interface holds).

    Raises:
        TrainConfigError: the group spans hosts, the user set no interface and none of
            this host's interfaces holds ``node_ip``.
    """
    env = os.environ if environ is None else environ
    var = SOCKET_IFNAME_VARS.get(backend)
    if var is None:
        return None
    current = env.get(var)
    if current is not None and current != _ours.get(var):
        return None  # the user's choice, never overridden
    name = interface_of(node_ip)
    if name is None:
        if not multi_host:
            return None  # every rank on this host: the backend's default reaches them
        raise TrainConfigError(no_interface_text(backend, var, node_ip, master_addr, rank))
    env[var] = name
    _ours[var] = name
    return name


def no_interface_text(backend: str, var: str, node_ip: str, master_addr: str, rank: int) -> str:
    """The error of a rank whose node IP is on none of its host's interfaces."""
    known = ", ".join(f"{n}={a}" for a, n in sorted(interface_addresses().items())) or "none"
    return (
        f"rank {rank}: no network interface of this host has its Ray node IP {node_ip} "
        f"(interfaces: {known}), so lumos cannot tell {backend} which interface reaches "
        f"rank 0 at {master_addr}. Set {var} to the interface to use in the workers' "
        f"environment: RunConfig(worker_runtime_env={{'env_vars': {{'{var}': 'eth0'}}}}) "
        f"or the environment of `ray start` on every host; or start Ray with "
        f"`ray start --node-ip-address=<an address of this host>`."
    )
