"""infra/prometheus/rules.yaml, the recording and alerting rules, checked by the real promtool
(Debian's `prometheus` package): they load, their unit tests (rules.test.yaml) pass with series
that fire every alert and series that must not, the refusals they count are error codes of the
catalogue, and docs/operations.md's Prometheus configuration loads them.
tests/integration/test_prometheus.py evaluates the same expressions against a real stack."""

from __future__ import annotations

import re
import subprocess

import yaml

from contract import errors
from devstack.processes import ROOT
from tests.promql import RULES, rules
from tests.system import prometheus_binary

RULE_TESTS = RULES.parent / "rules.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [prometheus_binary("promtool"), *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


def test_promtool_checks_the_rules():
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_runs_the_rules_unit_tests():
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not():
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert alerts <= fired, alerts - fired
    assert alerts <= quiet, alerts - quiet


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    """The unit tests can fail: the queue alert's `unless` turned into an `and` misses a model
    whose workers' series are gone."""
    text = RULES.read_text().replace(
        "unless on (model) tokenspool:workers:max > 0", "and on (model) tokenspool:workers:max == 0"
    )
    assert text != RULES.read_text()
    (tmp_path / "rules.yaml").write_text(text)
    (tmp_path / "rules.test.yaml").write_text(RULE_TESTS.read_text())
    done = subprocess.run(
        [prometheus_binary("promtool"), "test", "rules", "rules.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "TokenspoolQueuedWithoutWorkers" in done.stdout + done.stderr


def test_the_refusals_the_rules_count_are_error_codes_of_the_catalogue():
    """`reason` is the code of contract/errors.py's refusal: a misspelt one would never match."""
    matchers = re.findall(r'reason=~?"([^"]+)"', RULES.read_text())
    codes = {code for m in matchers for code in m.split("|")}
    assert {"storage_full", "queue_full", "rate_limit_exceeded"} <= codes
    assert all(errors.lookup(code) for code in codes), {c for c in codes if not errors.lookup(c)}


def test_the_scrape_config_of_the_docs_loads_the_rules(tmp_path):
    """docs/operations.md's Prometheus configuration, with its rules file where it says, as
    `promtool check config` reads it (the rules included)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## Dashboards and alerts") : text.index("## Tracing")]
    config = re.findall(r"```yaml\n(.*?)```", section, re.S)[0]
    assert "/etc/prometheus/tokenspool/rules.yaml" in config
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/tokenspool/rules.yaml", str(RULES))
    )
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout
