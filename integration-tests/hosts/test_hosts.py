"""Scenarios on a cluster of real hosts (network namespaces on a bridge; ``hosts.py``).

Nothing here sets ``GLOO_SOCKET_IFNAME``: the harness unsets it for everything it
starts, and every host's hostname resolves to 127.0.1.1. lumos must pick, on every
rank, the interface that reaches the other hosts (``eth1``, not the decoy ``eth0``
nor loopback). Roles of the hosts: ``host_cluster.py``.

Bugs the hosts found, each with its regression test:

* gloo bound the hostname's address (127.0.1.1) and told the peers on other hosts
  to connect there: ``Gloo connectFullMesh failed ... Connection refused,
  remote=[127.0.1.1]``. lumos now sets ``GLOO_SOCKET_IFNAME`` on each rank to the
  interface holding its Ray node IP, unless the user set it:
  ``test_ddp_across_three_hosts_exchanges_gradients_over_the_bridge`` (and
  ``packages/train/tests/test_socket_interface.py``).
* Two hosts with one hostname: a second driver checked the live driver's pid in its
  own process table, found it dead and took the run's lease (two drivers writing one
  run). The lease now records its machine (boot id, PID namespace) and checks the pid
  only there: ``test_a_second_driver_on_a_host_with_the_same_hostname_is_refused``
  (and ``packages/storage/tests/test_lease_hosts.py``).
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from host_cluster import DRIVER_HOST, HEAD, OBSERVER, SPARE, WORKERS, Driver, HostCluster
from hosts import DATA_IF, RAY_START_ATTEMPTS, STATE_DIR, SUBNET, Host, Hosts

pytestmark = pytest.mark.timeout(600)

NET = ipaddress.ip_network(f"{SUBNET}.0/24")


def _on_bridge(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host) in NET


def _ok(driver: Driver, timeout_s: float = 300) -> dict[str, Any]:
    """The driver's result; fails with its output unless ``fit()`` returned cleanly."""
    result: dict[str, Any] = driver.result(timeout_s)
    assert "raised" not in result, driver.output()[-6000:]
    assert result["error"] is None, driver.output()[-6000:]
    return result


def _stop_file(cluster: HostCluster, name: str) -> Path:
    """A file the hosts all see: the workloads run until it exists."""
    path = STATE_DIR / f"{name}.stop"
    path.unlink(missing_ok=True)
    return path


def _steps_contiguous(result: dict[str, Any]) -> None:
    steps = result["steps"]
    assert steps == list(range(1, len(steps) + 1)), steps


def _committed_complete(state: dict[str, Any]) -> None:
    """Every committed checkpoint has one shard per rank of its step's world."""
    assert state["status"] == "finished", state
    assert state["uncommitted"] == [], state["uncommitted"]
    by_dir: dict[str, list[dict[str, Any]]] = {}
    for record in state["written"]:
        by_dir.setdefault(record["dir"], []).append(record)
    for name in state["checkpoints"]:
        records = by_dir[name]
        worlds = {r["world"] for r in records}
        assert len(worlds) == 1, (name, records)
        assert sorted(r["rank"] for r in records) == list(range(worlds.pop())), (name, records)


def test_ddp_across_three_hosts_exchanges_gradients_over_the_bridge(
    hosts_cluster: HostCluster,
) -> None:
    cluster = hosts_cluster
    driver = cluster.driver(
        "ddp-3-hosts", num_workers=4, train_loop_config={"steps": 3}, torch_timeout_s=120
    )
    result = _ok(driver)
    metrics = result["metrics"]
    ranks = metrics["ranks"]
    worker_ips = {cluster[i].address for i in (HEAD, *WORKERS)}
    assert {r["node_ip"] for r in ranks} == worker_ips, ranks  # SPREAD: all 3 hosts
    for r in ranks:
        assert r["gloo_socket_ifname"] == DATA_IF, r  # chosen by lumos, not the decoy
        assert r["master_addr"] == ranks[0]["node_ip"]
        assert len(r["peers"]) == 3, r  # gloo's full mesh: one pair per other rank
        assert all(_on_bridge(local) and _on_bridge(peer) for local, peer in r["peers"]), r
        others = {o["node_ip"] for o in ranks if o["node_ip"] != r["node_ip"]}
        assert others <= {peer.rsplit(":", 1)[0] for _, peer in r["peers"]}, r
    # the averaged gradient is 8 * mean(rank + 1) = 20 only if the ranks exchanged it
    assert metrics["grads"] == [[20.0] * 4] * 4
    _steps_contiguous(result)
    state = result["state"]
    assert state["checkpoints"] == ["step=1", "step=2", "step=3"]
    assert all(len(files) == 4 for files in state["shards"].values()), state["shards"]
    _committed_complete(state)
    cluster.finished_runs.append("ddp-3-hosts")


def test_fixed_size_run_replaces_the_ranks_of_a_lost_host(hosts_cluster: HostCluster) -> None:
    cluster = hosts_cluster
    hold = 2
    driver = cluster.driver(
        "lose-a-host",
        num_workers=4,
        max_failures=2,
        train_loop_config={"steps": 4, "hold_at": hold},
        torch_timeout_s=120,
    )
    rows = driver.wait_for(f"step {hold}", lambda rows: any(r["step"] == hold for r in rows))
    victim = cluster[WORKERS[1]]
    assert victim.address in rows[-1]["nodes"]
    victim.kill_all()  # the machine dies: every process on it at once
    lost_at = time.time()
    result = _ok(driver)
    metrics = result["metrics"]
    assert metrics["world_size"] == 4
    assert metrics["resumed_from"] == hold
    assert victim.address not in {r["node_ip"] for r in metrics["ranks"]}
    _steps_contiguous(result)
    state = result["state"]
    assert state["attempts"] == 2
    _committed_complete(state)
    again = [r for r in driver.rows() if r["attempt"] == 1]
    print(f"host loss to training again: {again[0]['t'] - lost_at:.1f} s")
    cluster.finished_runs.append("lose-a-host")


@pytest.mark.long  # plain nox: the lost host above; tests/cluster's elastic growth
def test_elastic_run_shrinks_on_host_loss_and_grows_when_a_host_joins(
    hosts_cluster: HostCluster,
) -> None:
    cluster = hosts_cluster
    until = _stop_file(cluster, "elastic")
    driver = cluster.driver(
        "elastic-hosts",
        num_workers=[2, 3],
        resources_per_worker={"CPU": 2},  # one worker per host
        resize_interval_s=3,
        max_failures=3,
        train_loop_config={"steps": 2, "step_s": 0.5, "until": str(until)},
        torch_timeout_s=120,
    )
    driver.wait_for("3 workers", lambda rows: any(r["world_size"] == 3 for r in rows))
    victim = cluster[WORKERS[1]]
    victim.kill_all()
    lost_at = time.time()
    rows = driver.wait_for("the shrink to 2", lambda rows: rows[-1]["world_size"] == 2)
    shrunk = next(r for r in rows if r["world_size"] == 2)
    cluster.join(cluster[SPARE])
    joined_at = time.time()
    rows = driver.wait_for(
        "the grow to 3", lambda rows: rows[-1]["world_size"] == 3 and rows[-1]["attempt"] > 0
    )
    grown = next(r for r in rows if r["world_size"] == 3 and r["attempt"] > 0)
    assert cluster[SPARE].address in grown["nodes"]
    assert victim.address not in grown["nodes"]
    until.touch()
    result = _ok(driver)
    _steps_contiguous(result)
    _committed_complete(result["state"])
    print(
        f"elastic: host loss to training at 2: {shrunk['t'] - lost_at:.1f} s; "
        f"host join to training at 3: {grown['t'] - joined_at:.1f} s"
    )
    cluster.finished_runs.append("elastic-hosts")


def _elastic_one_per_host(cluster: HostCluster, name: str, until: Path, **config: Any) -> Driver:
    """An elastic (2, 3) run with one worker per host (2 CPUs each), until ``until``."""
    options: dict[str, Any] = {
        "num_workers": [2, 3],
        "resources_per_worker": {"CPU": 2},
        "resize_interval_s": 3,
        "max_failures": 3,
        "train_loop_config": {"steps": 2, "step_s": 0.5, "until": str(until)},
        "torch_timeout_s": 120,
    }
    options.update(config)
    return cluster.driver(name, **options)


@pytest.mark.long  # no partition in plain nox; the nearest: the lost host above
def test_partition_is_survived_without_split_brain(hosts_cluster: HostCluster) -> None:
    cluster = hosts_cluster
    until = _stop_file(cluster, "partition")
    driver = _elastic_one_per_host(cluster, "partition", until)
    driver.wait_for("3 workers", lambda rows: any(r["world_size"] == 3 for r in rows))
    victim = cluster[WORKERS[1]]
    victim.set_link(False)  # nothing killed: the host is cut off
    cut_at = time.time()
    try:
        # A second driver (another host) for the same run is refused: the lease.
        second = cluster.driver("partition", host=HEAD, num_workers=2)
        refused = second.result(180)
        assert refused.get("raised") == "LeaseHeldError", second.output()[-4000:]
        rows = driver.wait_for(
            "training without the cut-off host",
            lambda rows: rows[-1]["world_size"] == 2 and victim.address not in rows[-1]["nodes"],
        )
        detected = next(r for r in rows if r["world_size"] == 2)
    finally:
        victim.set_link(True)
    healed_at = time.time()
    driver.wait_for("20 s of training after the heal", lambda rows: rows[-1]["t"] > healed_at + 20)
    until.touch()
    result = _ok(driver)
    _steps_contiguous(result)
    state = result["state"]
    _committed_complete(state)
    # The cut-off ranks never wrote after the heal, nor did any rank of the attempt the
    # partition ended. (The healed host may rejoin: new ranks of a later attempt there
    # are fine, in other processes.)
    cut_off = {(r["node_ip"], r["pid"]) for r in state["written"] if r["attempt"] == 0}
    cut_off = {key for key in cut_off if key[0] == victim.address}
    assert cut_off, "the cut-off host's rank wrote no shard before the partition"
    late = [r for r in state["written"] if r["modified"] >= healed_at]
    assert all((r["node_ip"], r["pid"]) not in cut_off for r in late), late
    assert all(r["attempt"] > 0 for r in late), late
    print(f"partition: cut to training without the host: {detected['t'] - cut_at:.1f} s")


@pytest.mark.long  # plain nox: tests/cluster's drained node
def test_preemption_drain_moves_the_rank_off_the_host(hosts_cluster: HostCluster) -> None:
    cluster = hosts_cluster
    until = _stop_file(cluster, "drain")
    victim = cluster[WORKERS[1]]
    driver = _elastic_one_per_host(cluster, "drain", until, max_failures=0)
    try:
        driver.wait_for("3 workers", lambda rows: any(r["world_size"] == 3 for r in rows))
        cluster.join(cluster[SPARE])  # somewhere for the drained rank to go
        drained = cluster.drain(WORKERS[1], deadline_s=60)
        assert drained["accepted"], drained
        noticed_at = time.time()
        rows = driver.wait_for(
            "the rank to move off the drained host",
            lambda rows: rows[-1]["attempt"] > 0 and victim.address not in rows[-1]["nodes"],
        )
        moved = next(r for r in rows if r["attempt"] > 0)
        assert moved["world_size"] == 3, moved
        assert cluster[SPARE].address in moved["nodes"], moved
        until.touch()
        result = _ok(driver)  # max_failures=0: a preemption that moved in time is no failure
    finally:
        until.touch()
        cluster.restart_host(WORKERS[1])  # a drained node stays out of scheduling
    _steps_contiguous(result)
    _committed_complete(result["state"])
    print(f"drain: notice to training on the new host: {moved['t'] - noticed_at:.1f} s")


def test_slow_lossy_link_neither_hangs_nor_fails(hosts_cluster: HostCluster) -> None:
    cluster = hosts_cluster
    host = cluster[WORKERS[1]]
    netem = ["tc", "qdisc", "add", "dev", DATA_IF, "root", "netem", "delay", "50ms", "loss", "1%"]
    added = host.run(netem)
    if added.returncode != 0:
        pytest.skip(f"tc netem unavailable on this kernel: {added.stderr.strip()}")
    try:
        driver = cluster.driver("lossy", num_workers=4, train_loop_config={"steps": 5})
        result = _ok(driver, timeout_s=400)
    finally:
        host.run(["tc", "qdisc", "del", "dev", DATA_IF, "root"])
    assert host.address in {r["node_ip"] for r in result["metrics"]["ranks"]}
    _steps_contiguous(result)
    _committed_complete(result["state"])
    assert result["state"]["checkpoints"] == [f"step={i}" for i in range(1, 6)]


@pytest.mark.long  # plain nox: integration's sweeps
def test_sweep_across_hosts_prunes_and_resumes_after_driver_sigkill_from_another_host(
    hosts_cluster: HostCluster,
) -> None:
    cluster = hosts_cluster
    until = _stop_file(cluster, "sweep")
    progress = STATE_DIR / "sweep.progress.jsonl"
    progress.unlink(missing_ok=True)
    xs = [0.5, 5.0, 0.2]  # 5.0: loss >= 1 at its first report, pruned
    first = cluster.sweep("sweep", xs=xs, until=str(until), progress=str(progress), phase=1)

    def held(rows: list[dict[str, Any]]) -> bool:
        steps = {x: max((r["step"] for r in rows if r["x"] == x), default=0) for x in xs}
        return steps[0.5] >= 2 and steps[0.2] >= 2  # the bad trial was pruned to make room

    try:
        first.wait_for("both good trials past step 2", held, timeout_s=300)
    finally:
        first.kill()  # SIGKILL: no cleanup, the lease left to expire
    killed_at = time.time()
    until.touch()
    more = max(r["step"] for r in first.rows()) + 3  # every resumed trial trains again

    # Rerun at once from another host: the killed driver's lease has not expired yet
    # and no other host can tell a dead driver from a live one, so the rerun is refused
    # at once, naming when the lease expires; rerun after that, it resumes.
    def rerun() -> Driver:
        return cluster.sweep(
            "sweep", host=HEAD, xs=xs, until=str(until), progress=str(progress), phase=2, steps=more
        )

    second = rerun()
    outcome = second.result(360)
    if isinstance(outcome, dict):
        assert outcome["raised"] == "LeaseHeldError", second.output()[-4000:]
        assert 0 < outcome["expires_in_s"] <= 60, outcome
        time.sleep(outcome["expires_in_s"] + 1)
        second = rerun()
        outcome = second.result(360)
    by_x = {row["x"]: row for row in outcome}
    assert by_x[5.0]["status"] == "PRUNED", outcome
    assert by_x[0.5]["status"] == "TERMINATED", outcome
    assert by_x[0.2]["status"] == "TERMINATED", outcome
    before = [r for r in second.rows() if r["phase"] == 1]
    after = [r for r in second.rows() if r["phase"] == 2]
    assert all(r["x"] != 5.0 for r in after), "the pruned trial ran again"
    for x in (0.5, 0.2):
        resumed = [r for r in after if r["x"] == x]
        last_before = max(r["step"] for r in before if r["x"] == x)
        assert resumed, (x, after)
        assert resumed[0]["resumed_from"] >= 1, resumed[0]  # from its own checkpoint
        # a row is written after report() returned: the driver may die between the
        # commit of step N and rank 0's row for it, so the run resumes one past the rows
        assert resumed[0]["resumed_from"] <= last_before + 1
    resumed_at = min(r["t"] for r in after)
    print(
        f"sweep: driver SIGKILL to training again on another host: {resumed_at - killed_at:.1f} s"
    )


def test_a_second_driver_on_a_host_with_the_same_hostname_is_refused(
    hosts_cluster: HostCluster,
) -> None:
    cluster = hosts_cluster
    until = _stop_file(cluster, "twin")
    driver = cluster.driver(
        "twin", num_workers=2, train_loop_config={"steps": 1, "step_s": 0.3, "until": str(until)}
    )
    try:
        driver.wait_for("training", lambda rows: len(rows) >= 2)
        assert (
            cluster[OBSERVER].run(["hostname"]).stdout
            == cluster[DRIVER_HOST].run(["hostname"]).stdout
        )
        second = cluster.try_lease("twin", host=OBSERVER)
    finally:
        until.touch()
    assert second.get("raised") == "LeaseHeldError", second
    result = _ok(driver)
    _steps_contiguous(result)
    _committed_complete(result["state"])


def test_lumos_ls_and_show_from_a_host_that_ran_nothing(hosts_cluster: HostCluster) -> None:
    cluster = hosts_cluster
    if not cluster.finished_runs:
        driver = cluster.driver("ls-me", num_workers=2, train_loop_config={"steps": 1})
        assert driver.result()["state"]["status"] == "finished"
        cluster.finished_runs.append("ls-me")
    listing = cluster.lumos("ls", "s3://lumos-hosts/runs", "--json")
    assert listing.returncode == 0, listing.stderr[-3000:]
    for name in cluster.finished_runs:
        assert name in listing.stdout, listing.stdout
    shown = cluster.lumos("show", f"s3://lumos-hosts/runs/{cluster.finished_runs[0]}")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "finished" in shown.stdout, shown.stdout


class _ScriptedHost(Host):
    """A host whose ``ray start`` outcomes are given; records kills and boots."""

    def __init__(self, outcomes: list[tuple[int, str]]) -> None:
        super().__init__(index=7)
        self.outcomes = outcomes
        self.calls: list[str] = []

    def run(self, command: Any, env: Any = None, timeout: float = 120.0) -> Any:
        self.calls.append("ray start")
        code, stderr = self.outcomes.pop(0)
        return subprocess.CompletedProcess(command, code, stdout="", stderr=stderr)

    def kill_all(self) -> None:
        self.calls.append("kill_all")

    def boot(self) -> None:
        self.calls.append("boot")


TIMED_OUT = "Exception: The current node timed out during startup. This could happen ..."


def test_a_node_that_misses_rays_startup_deadline_is_restarted_on_a_clean_host() -> None:
    host = _ScriptedHost([(1, TIMED_OUT), (0, "")])
    Hosts(1).ray_join(host, "10.0.0.1:6379")
    assert host.calls == ["ray start", "kill_all", "boot", "ray start"]

    host = _ScriptedHost([(1, TIMED_OUT)] * RAY_START_ATTEMPTS)
    with pytest.raises(RuntimeError, match=f"attempt {RAY_START_ATTEMPTS} \\(1\\)"):
        Hosts(1).ray_head(host)

    # any other failure is not retried
    host = _ScriptedHost([(1, "ValueError: bad --num-cpus"), (0, "")])
    with pytest.raises(RuntimeError, match="bad --num-cpus"):
        Hosts(1).ray_join(host, "10.0.0.1:6379")
    assert host.calls == ["ray start"]
