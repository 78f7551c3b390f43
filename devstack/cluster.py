"""A valkey cluster on loopback for the tests and benchmarks (devstack/processes.py starts
its nodes): distinct ports, the slots shared out, replicas attached, and no node left running
when the cluster cannot form."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from devstack.processes import Proc, _wait, free_port, start_redis


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with contextlib.suppress(OSError), socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
                return port


def cluster_ports(n: int) -> list[int]:
    """`n` cluster ports, no two nodes sharing a port or a bus port: each is free when picked,
    but the kernel may hand a port it just gave back out again (seen under two test lanes:
    two nodes of one cluster on one port, the second refused)."""
    ports: list[int] = []
    while len(ports) < n:
        port = _cluster_port()
        taken = {*ports, *(p + 10000 for p in ports)}
        if port not in taken and port + 10000 not in taken:
            ports.append(port)
    return ports


def start_cluster(
    log_dir: Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000, tethered: bool = False
) -> tuple[list[Proc], str]:
    """A valkey cluster on loopback: `masters` primaries sharing the 16384 slots evenly, each
    with `replicas` replicas (a primary that dies fails over after `node_timeout_ms`).
    Returns the processes (primaries first) and a `redis+cluster://` URL naming the first."""
    ports = cluster_ports(masters * (1 + replicas))
    procs: list[Proc] = []
    try:
        _form_cluster(log_dir, ports, procs, masters, node_timeout_ms, tethered)
    except BaseException:  # the nodes started are stopped: none outlives a failed start
        for p in procs:
            p.stop()
        raise
    return procs, f"redis+cluster://127.0.0.1:{ports[0]}/0"


def _form_cluster(
    log_dir: Path, ports: list[int], procs: list[Proc], masters: int, node_timeout_ms: int, tethered: bool
) -> None:
    """Start a node on each port (into `procs`), give the primaries their slots and the
    replicas their primaries, and wait until the cluster is whole."""
    import redis

    replicas = len(ports) // masters - 1
    for port in ports:
        extra = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            f"nodes-{port}.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
        )
        procs.append(start_redis(log_dir, port=port, tethered=tethered, extra=extra)[0])
    nodes = [redis.Redis(port=port, socket_timeout=5, decode_responses=True) for port in ports]
    per = 16384 // masters
    for i in range(masters):
        nodes[i].execute_command(
            "CLUSTER ADDSLOTSRANGE", i * per, 16383 if i == masters - 1 else (i + 1) * per - 1
        )
    for node in nodes[1:]:
        node.execute_command("CLUSTER MEET", "127.0.0.1", ports[0])
    _wait(lambda: all(int(n.cluster("info")["cluster_known_nodes"]) == len(nodes) for n in nodes), 30, *procs)
    for r, replica in enumerate(nodes[masters:]):
        replica.execute_command("CLUSTER REPLICATE", nodes[r % masters].execute_command("CLUSTER MYID"))
    _wait(lambda: all(n.cluster("info")["cluster_state"] == "ok" for n in nodes), 30, *procs)
    if replicas:
        _wait(lambda: all(n.info("replication")["master_link_status"] == "up" for n in nodes[masters:]), 30)
    for n in nodes:
        n.close()
