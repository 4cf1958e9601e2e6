"""torchft's quorums under lumos's lighthouse settings, with a real lighthouse (no Ray).

Each replica here does what a torchft ``Manager`` does at every step: heartbeat in the
background, ask the lighthouse for a quorum, then train for a step. A replica that
joins late (a replacement) must end up in the same quorum as the others, also when a
step takes longer than the lighthouse's join timeout: with lumos's old default
``join_timeout_ms=100`` and 0.25 s steps, three replicas never formed a quorum of three
again after one joined; they took turns in quorums of two, every one a new process
group and a heal of the replica left behind (CI once saw that end in a 60 s wait).
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

STEP_S = 0.25
STEPS = 10


def _replica(
    address: str, rid: str, start_s: float, sizes: dict[str, list[int]], steps: int
) -> None:
    from torchft.coordination import LighthouseClient

    time.sleep(start_s)
    client = LighthouseClient(address, connect_timeout=datetime.timedelta(seconds=10))
    done = threading.Event()

    def heartbeat() -> None:  # as the manager's server does until the manager stops
        while not done.is_set():
            client.heartbeat(rid)
            time.sleep(0.1)

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        for step in range(steps):
            quorum = client.quorum(
                replica_id=rid, timeout=datetime.timedelta(seconds=30), step=step
            )
            sizes[rid].append(len(quorum.participants))
            time.sleep(STEP_S)  # the step's forward, backward and all-reduce
    finally:
        done.set()


def _quorum_sizes(lighthouse_args: dict[str, object]) -> dict[str, list[int]]:
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(**lighthouse_args)
    sizes: dict[str, list[int]] = {"a": [], "b": [], "late": []}
    starts = {"a": (0.0, STEPS), "b": (0.0, STEPS), "late": (2 * STEP_S, STEPS - 2)}
    threads = [
        threading.Thread(target=_replica, args=(server.address(), rid, start, sizes, steps))
        for rid, (start, steps) in starts.items()
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        server.shutdown()
    return sizes


def test_a_late_replica_joins_the_others_quorum_when_a_step_outlasts_the_join_wait() -> None:
    pytest.importorskip("torchft")
    from lumos.train.torch import TorchftConfig

    sizes = _quorum_sizes(TorchftConfig().lighthouse_args())
    # every replica trains in a quorum of all three once the late one is in
    assert all(3 in s for s in sizes.values()), sizes
    joined = sizes["late"].index(3)
    assert sizes["late"][joined : joined + 4] == [3, 3, 3, 3], sizes
