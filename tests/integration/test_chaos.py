"""A one-minute chaos campaign (bench/faults/chaos.py) in the suite: six streams on two API replicas
and three workers while a fault fires every ~4 s, the kinds in turn (a worker killed, a
worker frozen past its heartbeat window, an API replica killed, a Redis failover through
Sentinel: the primary killed, killed with its replica held behind, or failed over on
request). Every stream must end with its finish chunk and [DONE], pass the stream contract
once stitched across its resumes, and carry exactly the server's replay of its job. (Redis
restarts from the AOF, the campaign's other Redis fault, have their own tests:
test_outage.py.)"""

from __future__ import annotations

import pytest

from bench.faults.chaos import Config, format_fault_log, format_summary, run_campaign

FAULTS = ("kill", "stop", "api", "failover")

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_no_stream_hangs_breaks_or_loses_text_under_a_minute_of_faults(tmp_path):
    cfg = Config(
        streams=6,
        minutes=1.0,
        seed=7,
        fault_every=4.0,
        faults=FAULTS,
        cycle=True,
        drain_s=60.0,
        logs=tmp_path,
    )
    report = run_campaign(cfg)
    summary = f"{format_summary(report)}\nfaults:\n{format_fault_log(report)}"
    print(summary)
    assert report.completed > 0, summary
    assert all(report.faults[kind] for kind in FAULTS), f"every kind fires at least once\n{summary}"
    assert (report.hung, report.broken, report.lost) == (0, 0, 0), summary
