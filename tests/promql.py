"""The PromQL tokenspool ships, made evaluable outside Grafana: infra/prometheus/rules.yaml's
rules, and infra/grafana/*.json's panels and variables (Grafana's `$__rate_interval`, `$model`
and `$worker` given values); and the metric names a query selects, for the checks that each
is one /metrics declares (tests/unit/devstack/test_dashboards.py,
tests/integration/test_prometheus.py)."""

from __future__ import annotations

import json
import re

import yaml

from devstack.processes import ROOT

RULES = ROOT / "infra" / "prometheus" / "rules.yaml"
FILES = sorted((ROOT / "infra" / "grafana").glob("*.json"))
# What Grafana puts in a query before Prometheus sees it: the rate window, and the
# variables' "All" (`allValue`, in `=~` matchers only).
GRAFANA = {"$__rate_interval": "1m", "$model": ".*", "$worker": ".*"}
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*\w+\)$")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
_KEYWORDS |= {"offset", "inf", "nan"}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def recorded() -> set[str]:
    """The series the recording rules make (the alerts query them by name)."""
    return {r["record"] for r in rules() if "record" in r}


def concrete(expr: str) -> str:
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def _panels(panels: list[dict]) -> list[dict]:
    return [p for panel in panels for p in (panel, *_panels(panel.get("panels", [])))]


def shipped() -> list[tuple[str, str]]:
    """(where, PromQL) for every rule, panel query and variable query tokenspool ships."""
    out = [(f"rules.yaml {r.get('record') or r['alert']}", r["expr"]) for r in rules()]
    for path in FILES:
        board = json.loads(path.read_text())
        for panel in _panels(board["panels"]):
            for target in panel.get("targets", []):
                out.append((f"{path.name} {panel['title']!r} {target['refId']}", concrete(target["expr"])))
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                selector = _LABEL_VALUES.match(variable["query"]["query"])
                assert selector, variable
                out.append((f"{path.name} ${variable['name']}", concrete(selector.group(1))))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects: its identifiers, less what is inside strings, label
    matchers, ranges and grouping clauses, the functions and aggregations (an identifier
    before `(`) and the keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = re.findall(r"(?<![\w.:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {n for n in names if n.lower() not in _KEYWORDS}
