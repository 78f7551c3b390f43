"""The dashboards and the alerting rules against a real Prometheus (Debian's `prometheus`)
scraping a real stack's /metrics on loopback: valkey, a worker (the synthetic engine: no model
to load, the same runner and publisher), the API on its internal port, and Prometheus loading
infra/prometheus/rules.yaml. Every rule's and panel's query evaluates without error and names
only metrics the stack declares (a labelled metric with no samples yet still declares itself,
in Prometheus's metadata), every metric it declares is on a dashboard, every rule evaluates,
the queued-work alert goes pending for a known model with no worker, and each key's budget use
and refusals are series of its key id (the keys past METRICS_KEYS as one `other`)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from devstack.processes import (
    Proc,
    _spawn,
    _wait,
    free_port,
    start_api,
    start_redis,
    start_worker,
    wait_for_model,
)
from tests.promql import RULES, metric_names, recorded, rules, shipped
from tests.system import prometheus_binary

pytestmark = pytest.mark.integration

SERVED = "synthetic-a"
COLD = "synthetic-cold"  # KNOWN_MODELS: in /metrics with no worker
MAXMEMORY = 256 * 1024 * 1024
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
# the other tests' key, this module's last test's own (tiers and a token budget), and one past
# METRICS_KEYS=2 (`other`)
TENANT, OWN, SECOND = "sk-prometheus-tenant", "sk-prometheus-own-a", "sk-prometheus-other-b"
KEYS = f"{TENANT},{OWN} tiers=default tokens_per_minute=90000,{SECOND}"
AUTH = {"Authorization": f"Bearer {TENANT}"}


@dataclass
class Monitored:
    base: str  # the API's public port
    prometheus: str
    procs: list[Proc]

    def api(self, path: str, **params: str) -> dict:
        resp = httpx.get(self.prometheus + path, params=params, timeout=10)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def declared(self) -> dict[str, str]:
        """Metric family -> type, as Prometheus read them from the stack's /metrics."""
        return {
            m["metric"]: m["type"]
            for m in self.api("/api/v1/targets/metadata", match_target='{job="tokenspool"}')
        }


def declares(families: dict[str, str], name: str) -> bool:
    """Whether `name` is a series of a declared family (a histogram's `_bucket` included)."""
    if name in families:
        return True
    return any(
        name == family + suffix for family, kind in families.items() for suffix in SUFFIXES.get(kind, ())
    )


@pytest.fixture(scope="module")
def monitored(tmp_path_factory) -> Iterator[Monitored]:
    binary = prometheus_binary("prometheus")
    logs: Path = tmp_path_factory.mktemp("prometheus")
    redis_proc, url = start_redis(logs, extra=("--maxmemory", str(MAXMEMORY)))
    procs = [redis_proc]
    try:
        internal = free_port()
        api, base = start_api(
            logs,
            url,
            env={
                "INTERNAL_PORT": str(internal),
                "INTERNAL_HOST": "127.0.0.1",
                "KNOWN_MODELS": COLD,
                "API_KEYS": KEYS,
                "METRICS_KEYS": "2",
            },
        )
        procs.append(api)
        env = {"ENGINE": "synthetic", "MODEL_NAME": SERVED, "SYNTHETIC_TOKENS": "8", "SYNTHETIC_RATE": "0"}
        procs.append(start_worker(logs, url, env=env))
        wait_for_model(base, SERVED, procs=tuple(procs), headers=AUTH)

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "tokenspool", "static_configs": [{"targets": [f"127.0.0.1:{internal}"]}]}
            ],
        }
        (logs / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [
            binary,
            f"--config.file={logs / 'prometheus.yml'}",
            f"--storage.tsdb.path={logs / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        procs.append(_spawn("prometheus", argv, logs, tethered=True))
        monitored = Monitored(base, f"http://127.0.0.1:{port}", procs)
        _wait(lambda: _scraped(monitored), 30, *procs)
        yield monitored
    finally:
        for p in reversed(procs):
            p.stop()


def _scraped(m: Monitored) -> bool:
    """Prometheus is up, has scraped the API, and has evaluated every rule once."""
    try:
        targets = m.api("/api/v1/targets")["activeTargets"]
        groups = m.api("/api/v1/rules")["groups"]
    except (httpx.HTTPError, ValueError, AssertionError):
        return False
    up = [t for t in targets if t["labels"]["job"] == "tokenspool" and t["health"] == "up"]
    evaluated = [r for g in groups for r in g["rules"] if not r["lastEvaluation"].startswith("0001")]
    return bool(up) and len(evaluated) == len(rules())


def test_every_query_evaluates_and_names_only_declared_metrics(monitored):
    # a stream: latencies get samples
    with httpx.Client(base_url=monitored.base, timeout=30, headers=AUTH) as c:
        body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    families = monitored.declared()
    assert "tokenspool_time_to_first_token_seconds" in families and "tokenspool_workers" in families
    made = recorded()
    undeclared = {}
    for where, expr in shipped():
        monitored.api("/api/v1/query", query=expr)  # fails on an error
        names = metric_names(expr)
        if wrong := {n for n in names if not (declares(families, n) or n in made)}:
            undeclared[where] = wrong
    assert not undeclared, f"queries naming metrics /metrics does not declare: {undeclared}"
    # A misspelt name evaluates (to nothing): only the check above finds it.
    assert monitored.api("/api/v1/query", query="sum(rate(tokenspool_jobs_creted_total[1m]))")["result"] == []
    assert not declares(families, "tokenspool_jobs_creted_total")


def test_every_declared_metric_is_on_a_dashboard(monitored):
    queried = {
        n for where, expr in shipped() if not where.startswith("rules.yaml") for n in metric_names(expr)
    }
    families = monitored.declared()
    missing = {
        family
        for family, kind in families.items()
        if not family.endswith("_created")  # prometheus_client's creation times
        and not any(declares({family: kind}, n) for n in queried)
    }
    assert not missing, f"metrics on no dashboard (devstack/dashboards.py): {sorted(missing)}"


def test_every_rule_evaluates(monitored):
    groups = monitored.api("/api/v1/rules")["groups"]
    evaluated = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(evaluated) == {r.get("record") or r["alert"] for r in rules()}
    assert all(r["health"] == "ok" for r in evaluated.values()), {
        n: r.get("lastError") for n, r in evaluated.items() if r["health"] != "ok"
    }


def test_redis_memory_is_read_against_its_maxmemory(monitored):
    def value(query: str) -> float:
        (sample,) = monitored.api("/api/v1/query", query=query)["result"]
        return float(sample["value"][1])

    assert value("max(tokenspool_redis_memory_max_bytes)") == MAXMEMORY
    used = value("max(tokenspool_redis_memory_used_bytes)")
    assert 0 < used < MAXMEMORY
    assert value("tokenspool:redis_memory:ratio") == pytest.approx(used / MAXMEMORY, rel=0.5)


def test_work_queued_for_a_model_without_workers_makes_its_alert_pending(monitored):
    with httpx.Client(base_url=monitored.base, timeout=30, headers=AUTH) as c:
        body = {"model": COLD, "messages": [{"role": "user", "content": "hi"}], "background": True}
        assert c.post("/v1/chat/completions", json=body).status_code == 202

    def pending() -> bool:
        alerts = monitored.api("/api/v1/alerts")["alerts"]
        return any(
            a["labels"]["alertname"] == "TokenspoolQueuedWithoutWorkers" and a["labels"].get("model") == COLD
            for a in alerts
        )

    deadline = time.monotonic() + 20
    while not pending():
        assert time.monotonic() < deadline, monitored.api("/api/v1/alerts")
        time.sleep(0.5)
    alerts = monitored.api("/api/v1/alerts")["alerts"]
    assert {
        a["labels"].get("model")
        for a in alerts
        if a["labels"]["alertname"] == "TokenspoolQueuedWithoutWorkers"
    } == {COLD}


def test_each_key_s_budget_use_and_refusals_are_series_of_its_key_id(monitored):
    """Per-tenant figures by key id, never the key: the first METRICS_KEYS keys' own, the rest
    summed as `other`, in Prometheus as scraped."""
    ours = hashlib.sha256(OWN.encode()).hexdigest()[:12]
    own = {"Authorization": f"Bearer {OWN}"}
    if time.time() % 60 > 45:  # the budgets turn with the minute: stay inside one
        time.sleep(61 - time.time() % 60)
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=monitored.base, timeout=30) as c:
        assert c.post("/v1/chat/completions", json=body, headers=own).status_code == 200
        second = {"Authorization": f"Bearer {SECOND}"}
        assert c.post("/v1/chat/completions", json=body, headers=second).status_code == 200
        refused = c.post("/v1/chat/completions", json={**body, "service_tier": "priority"}, headers=own)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "tier_not_allowed"

    def value(query: str) -> float | None:
        result = monitored.api("/api/v1/query", query=query)["result"]
        return float(result[0]["value"][1]) if result else None

    def figures() -> tuple:
        return (
            value(f'max_over_time(tokenspool_key_budget_used{{key="{ours}",budget="requests"}}[1m])'),
            value(f'max_over_time(tokenspool_key_budget_used{{key="{ours}",budget="tokens"}}[1m])'),
            value('max_over_time(tokenspool_key_budget_used{key="other",budget="requests"}[1m])'),
            value(f'tokenspool_key_requests_rejected_total{{key="{ours}",reason="tier_not_allowed"}}'),
        )

    deadline = time.monotonic() + 20
    # the series exist from the start (at 0): wait for a scrape after the requests
    while None in (got := figures()) or min(got) < 1:
        assert time.monotonic() < deadline, got
        time.sleep(0.5)
    requests, tokens, other, rejected = got
    assert requests == 1 and other == 1  # a job each: the refused request was never admitted
    assert tokens > 0 and rejected == 1
    assert value(f'tokenspool_key_budget_limit{{key="{ours}",budget="tokens"}}') == 90000
    assert value(f'tokenspool_key_budget_limit{{key="{ours}",budget="requests"}}') == 600  # the default
    keys = {s["key"] for s in monitored.api("/api/v1/series", **{"match[]": "tokenspool_key_budget_used"})}
    tenant = hashlib.sha256(TENANT.encode()).hexdigest()[:12]
    assert keys == {tenant, ours, "other"}  # no key in clear, nothing past METRICS_KEYS of its own
