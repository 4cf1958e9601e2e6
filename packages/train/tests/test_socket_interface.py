"""Which interface a rank's process group binds (``torch/interfaces.py``).

Regression of the hosts harness (``integration-tests/hosts``): without
``GLOO_SOCKET_IFNAME`` gloo bound the hostname's address (127.0.1.1 on Debian-like
hosts) and told the ranks on other hosts to connect there (``connectFullMesh failed
... Connection refused, remote=[127.0.1.1]``). Each rank now points the backend at the
interface holding its Ray node IP, never over a user's setting, and a multi-host group
whose node IP no interface holds fails at once, naming the variable to set.
"""

from __future__ import annotations

import sys

import pytest

from lumos.train import TrainConfigError
from lumos.train._internal.torch.interfaces import (
    choose_socket_interface,
    interface_addresses,
    interface_of,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="interfaces are read the Linux way"
)

UNASSIGNED = "203.0.113.7"  # TEST-NET-3: on no interface of any machine


def test_the_loopback_address_is_on_lo() -> None:
    assert interface_of("127.0.0.1") == "lo"
    assert interface_addresses()["127.0.0.1"] == "lo"
    assert interface_of(UNASSIGNED) is None
    assert interface_of("not-an-address") is None


def test_gloo_is_pointed_at_the_interface_of_the_node_ip() -> None:
    env: dict[str, str] = {}
    assert choose_socket_interface("gloo", "127.0.0.1", "127.0.0.1", True, 1, env) == "lo"
    assert env == {"GLOO_SOCKET_IFNAME": "lo"}
    # the value lumos set is lumos's: the next launch chooses again
    assert choose_socket_interface("gloo", "127.0.0.1", "127.0.0.1", True, 1, env) == "lo"


def test_nccl_gets_its_own_variable() -> None:
    env: dict[str, str] = {}
    assert choose_socket_interface("nccl", "127.0.0.1", "127.0.0.1", True, 0, env) == "lo"
    assert env == {"NCCL_SOCKET_IFNAME": "lo"}
    assert choose_socket_interface("mpi", "127.0.0.1", "127.0.0.1", True, 0, env) is None


def test_a_users_setting_is_never_overridden() -> None:
    env = {"GLOO_SOCKET_IFNAME": "eth7"}
    assert choose_socket_interface("gloo", "127.0.0.1", "10.0.0.1", True, 2, env) is None
    assert env == {"GLOO_SOCKET_IFNAME": "eth7"}
    # not even when no interface has the node IP: the user knows the network
    assert choose_socket_interface("gloo", UNASSIGNED, "10.0.0.1", True, 2, env) is None


def test_multi_host_group_without_the_node_ips_interface_fails_naming_the_setting() -> None:
    env: dict[str, str] = {}
    with pytest.raises(TrainConfigError) as caught:
        choose_socket_interface("gloo", UNASSIGNED, "10.0.0.1", True, 3, env)
    text = str(caught.value)
    assert "rank 3" in text
    assert UNASSIGNED in text
    assert "10.0.0.1" in text
    assert "GLOO_SOCKET_IFNAME" in text
    assert "lo=127.0.0.1" in text  # the interfaces this host has
    assert env == {}


def test_single_host_group_keeps_the_backend_default() -> None:
    env: dict[str, str] = {}
    assert choose_socket_interface("gloo", UNASSIGNED, UNASSIGNED, False, 1, env) is None
    assert env == {}
