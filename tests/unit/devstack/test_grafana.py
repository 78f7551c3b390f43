"""devstack/grafana.py's JSON model: each dashboard's panels on a grid that does not overlap,
ids unique, every query on the dashboard's Prometheus variable."""

from __future__ import annotations

import pytest

from devstack.dashboards import DASHBOARDS
from devstack.grafana import DATASOURCE, Dashboard, Panel, Query, Row, render


def cells(panel: dict) -> set[tuple[int, int]]:
    g = panel["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda d: d.uid)
def test_panels_do_not_overlap_and_query_the_chosen_prometheus(dashboard):
    board = render(dashboard)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for p in panels:
        assert not cells(p) & taken, p["title"]
        assert all(0 <= x < 24 for x, _ in cells(p))
        taken |= cells(p)
    targets = [t for p in panels for t in p.get("targets", [])]
    assert targets and all(t["datasource"] == DATASOURCE and t["expr"] for t in targets)
    assert {v["name"] for v in board["templating"]["list"]} >= {"datasource", "model"}


def test_a_full_width_panel_starts_a_line():
    half = Panel("half", "", (Query("a"),))
    board = render(Dashboard("d", "d", "", (Row("r", (half, Panel("full", "", (Query("b"),), width=24))),)))
    heading, first, second = board["panels"]
    assert heading["gridPos"]["y"] == 0 and first["gridPos"] == {"h": 8, "w": 12, "x": 0, "y": 1}
    assert second["gridPos"] == {"h": 8, "w": 24, "x": 0, "y": 9}
