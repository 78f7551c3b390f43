"""devstack/processes.py's own choices, apart from the processes they start."""

from __future__ import annotations

from devstack import processes


def test_no_two_nodes_of_a_cluster_share_a_port_or_a_bus_port(monkeypatch):
    """The kernel may hand a port it just gave back out again: two nodes of one cluster were
    once started on one port, and the second was refused (issue 60)."""
    picks = iter([7001, 7001, 17001, 7002, 7001, 7003])
    monkeypatch.setattr(processes, "_cluster_port", lambda: next(picks))
    assert processes.cluster_ports(3) == [7001, 7002, 7003]
