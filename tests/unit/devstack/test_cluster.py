"""devstack/cluster.py's own choices, apart from the processes they start."""

from __future__ import annotations

import pytest

from devstack import cluster


def test_no_two_nodes_of_a_cluster_share_a_port_or_a_bus_port(monkeypatch):
    """The kernel may hand a port it just gave back out again: two nodes of one cluster were
    once started on one port, and the second was refused (issue 60)."""
    picks = iter([7001, 7001, 17001, 7002, 7001, 7003])
    monkeypatch.setattr(cluster, "_cluster_port", lambda: next(picks))
    assert cluster.cluster_ports(3) == [7001, 7002, 7003]


def test_a_cluster_that_cannot_form_leaves_no_node_running(monkeypatch, tmp_path):
    """A failed start used to leave its nodes running past the test (found after a loaded run)."""
    started = []

    class Node:
        def __init__(self) -> None:
            self.stopped = False

        def stop(self) -> None:
            self.stopped = True

    def form(log_dir, ports, procs, *args):
        for _ in ports[:2]:
            started.append(Node())
            procs.append(started[-1])
        raise RuntimeError("a node exited")

    monkeypatch.setattr(cluster, "cluster_ports", lambda n: list(range(7001, 7001 + n)))
    monkeypatch.setattr(cluster, "_form_cluster", form)
    with pytest.raises(RuntimeError):
        cluster.start_cluster(tmp_path, masters=3)
    assert len(started) == 2 and all(node.stopped for node in started)
