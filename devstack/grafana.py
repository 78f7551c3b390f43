"""Grafana dashboards as data, and the PromQL their panels share: the pieces devstack/dashboards.py
declares tokenspool's dashboards with, and Grafana's JSON model they are written as.

The pool's figures are the same on every API replica (read from Redis): `pool` and `pool_rate`
take their `max` across replicas. Each replica's own figures (streams, latencies, refusals)
take `sum`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract import errors

OUT = Path(__file__).resolve().parent.parent / "infra" / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
M = 'model=~"$model"'  # the dashboard's model variable
W = 'model=~"$model",worker=~"$worker"'  # and its worker variable


def _codes(*refusals: errors.ErrorCode) -> str:
    """A `reason=~` regex of error codes, from the catalogue."""
    return "|".join(e.code or "" for e in refusals)


BUDGETS = _codes(errors.RATE_LIMITED, errors.TOO_MANY_JOBS, errors.TOO_MANY_STREAMS)  # a key's
ROOM = _codes(errors.QUEUE_FULL, errors.STORAGE_FULL, errors.UNAVAILABLE)  # the pool's
KEYS = _codes(errors.MISSING_API_KEY, errors.INVALID_API_KEY, errors.TIER_NOT_ALLOWED, errors.OPERATOR_ONLY)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12  # of 24


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    workers: bool = False  # a $worker variable besides $model


def _selector(metric: str, labels: str) -> str:
    return f"{metric}{{{labels}}}" if labels else metric


def pool(metric: str, by: str = "model", labels: str = M) -> str:
    """A pool figure: the replicas' max."""
    return f"max by ({by}) ({_selector(metric, labels)})"


def pool_rate(metric: str, by: str = "model", labels: str = M) -> str:
    """A pool counter's rate: the replicas' max."""
    return f"max by ({by}) (rate({_selector(metric, labels)}[{RATE}]))"


def ratio(numerator: str, denominator: str, by: str = "model", labels: str = M) -> str:
    """One pool counter's rate over another's."""
    return f"{pool_rate(numerator, by, labels)} / {pool_rate(denominator, by, labels)}"


def quantiles(histogram: str) -> tuple[Query, ...]:
    """p50, p95 and p99 of a per-replica histogram, over every replica."""
    return tuple(
        Query(f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{{M}}}[{RATE}])))", f"p{p}")
        for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))
    )


def refused(codes: str) -> tuple[Query, ...]:
    """Requests refused with these error codes (a regex), per second, over every replica."""
    expr = f'sum by (reason) (rate(tokenspool_requests_rejected_total{{reason=~"{codes}"}}[{RATE}]))'
    return (Query(expr, "{{reason}}"),)


def _variable(name: str, query: str) -> dict:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def _panel(panel: Panel, id_: int, x: int, y: int) -> dict:
    return {
        "id": id_,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit, "min": 0}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend}
            for i, q in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict:
    """The dashboard as Grafana's JSON model (schema 39): its rows, their panels two to a line."""
    panels: list[dict] = []
    y = 0
    for row in dashboard.rows:
        grid = {"h": 1, "w": 24, "x": 0, "y": y}
        heading = {"type": "row", "title": row.title, "collapsed": False, "gridPos": grid, "panels": []}
        panels.append({"id": len(panels) + 1, **heading})
        y, x = y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                y, x = y + 8, 0
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
        y += 8
    variables = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
        },
        _variable("model", "label_values(tokenspool_workers, model)"),
    ]
    if dashboard.workers:
        variables.append(_variable("worker", f"label_values(tokenspool_worker_slots{{{M}}}, worker)"))
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["tokenspool"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def files(dashboards: tuple[Dashboard, ...]) -> dict[Path, str]:
    """Each dashboard's file in infra/grafana/ and its text, as committed."""
    return {OUT / f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in dashboards}


def write(dashboards: tuple[Dashboard, ...]) -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in files(dashboards).items():
        path.write_text(text)
    return list(files(dashboards))
