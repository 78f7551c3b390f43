"""worker/engine/sizing.py: a worker started with no SLOTS or thread counts sizes itself from its
memory budget and the cores it may really use (a container's quota, not the host's cores)."""

from __future__ import annotations

import os

import pytest

from worker.engine import sizing
from worker.engine.synthetic import DEFAULT_SLOTS, SyntheticEngine


def test_slots_fill_the_budget_up_to_the_cap():
    mib = 1 << 20
    assert sizing.slots_for(96 * mib, 1000 * mib, 32) == 10
    assert sizing.slots_for(96 * mib, 100_000 * mib, 32) == 32
    assert sizing.slots_for(96 * mib, 10 * mib, 32) == 1  # one slot even when the budget is short
    assert sizing.slots_for(0, 10 * mib, 64) == 64


def test_halvings_end_at_one():
    assert sizing.halvings(64) == [64, 32, 16, 8, 4, 2, 1]
    assert sizing.halvings(5) == [5, 2, 1]
    assert sizing.halvings(1) == [1]


def test_threads_fill_what_is_not_set():
    assert sizing.threads(None, None, 2) == sizing.Threads(1, 2)
    assert sizing.threads(None, None, 1) == sizing.Threads(1, 1)
    assert sizing.threads(None, None, 16) == sizing.Threads(8, 16)
    assert sizing.threads(3, None, 16) == sizing.Threads(3, 16)
    assert sizing.threads(None, 5, 16) == sizing.Threads(8, 5)


@pytest.mark.parametrize(
    "cpu_max,expected", [("max 100000", None), ("150000 100000", 2), ("50000 100000", 1)]
)
def test_a_cpu_quota_bounds_the_cores(tmp_path, cpu_max, expected):
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    affinity = len(os.sched_getaffinity(0))
    assert sizing.usable_cores(tmp_path) == min(affinity, expected or affinity)


def test_without_a_cgroup_the_affinity_counts(tmp_path):
    assert sizing.usable_cores(tmp_path / "absent") == len(os.sched_getaffinity(0))


def test_the_synthetic_engine_takes_slots_or_its_default():
    assert SyntheticEngine("synthetic-x", 64, 4, 0.0).slots == DEFAULT_SLOTS
    assert SyntheticEngine("synthetic-x", 64, 4, 0.0, 3).slots == 3


def test_a_cpu_worker_spins_briefly_unless_told():
    assert sizing.spin_count(None, 0) == sizing.CPU_SPINCOUNT
    assert sizing.spin_count(300_000, 0) == 300_000
    assert sizing.spin_count(0, 0) == 0


def test_a_worker_with_layers_on_a_gpu_leaves_libgomp_its_own():
    assert sizing.spin_count(None, -1) is None
    assert sizing.spin_count(None, 20) is None
    assert sizing.spin_count(5000, -1) == 5000
