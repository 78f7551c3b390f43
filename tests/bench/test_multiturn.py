"""bench/multiturn.py's pieces that need no server: its chart's rows."""

from __future__ import annotations

from bench import multiturn


def run(server: str, conversations: int, ttft: float) -> dict:
    return {"server": server, "streams": conversations, "ttft_p50": ttft, "tok_s_total": 1.0}


def test_the_chart_has_a_row_per_workload_with_each_run_s_conversations():
    data = {
        "multiturn-8-own": {"title": "own", "results": [run("routing on", 8, 1.0)]},
        "multiturn-16-own": {"title": "own", "results": [run("routing on", 16, 2.0)]},
        "multiturn-8-skewed": {"title": "skewed", "results": [run("routing off", 8, 3.0)]},
        "multiturn-8-own-kill": {"title": "killed", "results": [run("routing on", 8, 4.0)]},
    }
    rows = multiturn.by_workload(data)
    assert sorted(rows) == ["own", "own-kill", "skewed"]
    assert sorted(r["streams"] for r in rows["own"]["results"]) == [8, 16]
