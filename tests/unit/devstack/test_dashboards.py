"""infra/grafana/*.json: current with devstack/dashboards.py, and every query of theirs and of
infra/prometheus/rules.yaml parses (the real promtool reads them as recording rules) and names
only tokenspool's series. tests/integration/test_prometheus.py checks each name against what a
real stack's /metrics declares."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from devstack.dashboards import DASHBOARDS
from devstack.grafana import OUT, files
from tests.promql import FILES, metric_names, recorded, shipped
from tests.system import prometheus_binary


def promtool_parse(exprs: list[str], tmp_path) -> subprocess.CompletedProcess:
    """`promtool check rules` on each expression made a recording rule: it parses them all."""
    rules = [{"record": f"check:query{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    return subprocess.run(
        [prometheus_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_dashboards_are_current():
    assert files(DASHBOARDS) == {p: p.read_text() for p in FILES}, (
        "infra/grafana/ is stale: run python -m devstack.dashboards"
    )
    assert {p.parent for p in FILES} == {OUT} and len(FILES) == 4


def test_every_query_parses(tmp_path):
    queries = shipped()
    done = promtool_parse([e for _, e in queries], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout


def test_a_query_that_does_not_parse_fails(tmp_path):
    done = promtool_parse(
        ["max by (model) (tokenspool_workers", "sum(rate(tokenspool_streams_open))"], tmp_path
    )
    assert done.returncode != 0
    assert "unclosed left parenthesis" in done.stdout + done.stderr


def test_every_query_names_tokenspool_series_only():
    made = recorded()
    for where, expr in shipped():
        names = metric_names(expr)
        assert names, where
        assert all(n.startswith("tokenspool_") or n in made for n in names), (where, names - made)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("max by (model) (tokenspool_workers)", {"tokenspool_workers"}),
        ('sum by (reason) (rate(a_total{reason=~"x|max(y)"}[5m]))', {"a_total"}),
        ("a / on (model) group_left (tier) b offset 5m > bool 1e3", {"a", "b"}),
        ("x:rule:max > 0 unless on (model) y > 0 and z < nan", {"x:rule:max", "y", "z"}),
        ("histogram_quantile(0.95, sum by (le) (rate(h_bucket[1m])))", {"h_bucket"}),
        ("max without (instance) (absent(up))", {"up"}),
    ],
)
def test_metric_names_are_what_a_query_selects(expr, names):
    assert metric_names(expr) == names
