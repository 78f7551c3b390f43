"""bench/lib/charts.py: every benchmark's JSON, merged by section, drawn and tabled the one way."""

from __future__ import annotations

import json

import pytest

from bench.lib import charts


def entry(server_a: str = "tokenspool", tok: float = 100.0) -> dict:
    return {
        "title": "8B shape",
        "command": "bench/gpu_run --out OUT",
        "machine": "test",
        "results": [
            {
                "server": server_a,
                "streams": 32,
                "tok_s_total": tok,
                "ttft_p50": 0.1,
                "ttft_p95": 0.2,
                "ok": 96,
            },
            {"server": server_a, "streams": 64, "tok_s_total": tok * 1.5, "ttft_p50": 0.2, "ttft_p95": 0.4},
            {
                "server": "llama-server",
                "streams": 32,
                "tok_s_total": 90.0,
                "ttft_p50": 0.1,
                "ttft_p95": float("nan"),
            },
        ],
    }


def test_a_section_replaces_its_earlier_self_and_keeps_the_others(tmp_path):
    path = tmp_path / "r.json"
    charts.record(path, "a", entry(tok=1.0))
    charts.record(path, "b", entry())
    charts.record(path, "a", entry(tok=2.0))
    data = json.loads(path.read_text())
    assert sorted(data) == ["a", "b"] and data["a"]["results"][0]["tok_s_total"] == 2.0


def test_the_table_has_a_row_per_server_and_concurrency():
    lines = charts.markdown({"s": entry()})
    rows = [ln for ln in lines if ln.startswith("| tokenspool") or ln.startswith("| llama-server")]
    assert len(rows) == 3
    assert "| tokenspool | 32 | 96/32 | 100.0 | 100 / 200 |" in rows[0]
    assert "/ - |" in rows[2]  # a figure not measured is a dash, not nan


def test_a_section_s_notes_come_before_its_table_and_one_without_results_has_no_table():
    crash = {"title": "a worker killed", "notes": ["16 of 16 streams ended whole"]}
    lines = charts.markdown({"s": {**entry(), "notes": ["32 streams: tok/s 1.02"]}, "crash": crash})
    assert lines.index("32 streams: tok/s 1.02") < next(
        i for i, ln in enumerate(lines) if ln.startswith("| server")
    )
    tail = lines[lines.index("### a worker killed") :]
    assert "16 of 16 streams ended whole" in tail and not any(ln.startswith("|") for ln in tail)


def test_the_chart_is_drawn_from_any_sections(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "r.png"
    charts.draw({"a": entry(), "b": entry("tokenspool (2 workers)")}, png)
    assert png.read_bytes().startswith(b"\x89PNG")
