"""Jobs planted in Redis by someone with write access to RQ's keys: a worker acts on nothing
in a job hash but its `data`, and runs nothing but `JOB_FUNCTION(spec)` for a spec the API
recorded. Every field RQ's own worker would act on is planted here (callbacks it would
import and call, webhooks it would request, dependents, retries and repeats it would
enqueue, rate limits, groups, TTLs and timeouts, malformed values that would kill its loop,
ids that would re-run other jobs), next to RQ's maintenance registries and its pub/sub
shutdown command; then a legitimate request must still be served by the same worker.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import zlib
from pathlib import Path

import httpx
import pytest
import redis

from contract import keys
from contract.keys import JOB_FUNCTION, JobField
from devstack.processes import start_api, start_redis, start_worker, wait_for_model

pytestmark = pytest.mark.integration

MODEL = "synthetic-planted"
QUEUE = keys.queue_key(MODEL)

EVIL = '''
"""Planted by the test: importing or calling anything here leaves a mark."""
import os, pathlib
MARKS = pathlib.Path(os.environ["PLANTED_MARKS"])
(MARKS / f"imported-{os.getpid()}").write_text("imported")
def fn(*a, **k): (MARKS / "called-fn").write_text("x")
def on_failure(*a, **k): (MARKS / "called-on_failure").write_text("x")
def on_success(*a, **k): (MARKS / "called-on_success").write_text("x")
def on_stopped(*a, **k): (MARKS / "called-on_stopped").write_text("x")
'''


class Webhooks(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def _any(self) -> None:
        Webhooks.seen.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST = _any

    def log_message(self, *args) -> None:
        pass


def data(func: str, args: list, kwargs: dict | None = None) -> bytes:
    return zlib.compress(json.dumps([func, None, args, kwargs or {}]).encode())


def plant(r: redis.Redis, job_id: str, queue: str = QUEUE, **fields) -> None:
    """A job hash as RQ writes one (and worse), pushed onto a queue."""
    base = {
        "created_at": "2026-01-01T00:00:00.000000Z",
        "enqueued_at": "2026-01-01T00:00:00.000000Z",
        "origin": MODEL,
        "status": "queued",
        "description": "planted",
        "timeout": "180",
    }
    r.hset(keys.rq_job(job_id), mapping={**base, **fields})
    r.rpush(queue, job_id)


@pytest.fixture
def planted_stack(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "evil.py").write_text(EVIL)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Webhooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url, env={"KNOWN_MODELS": "synthetic-nobody"})
    worker = start_worker(
        tmp_path,
        url,
        name="w-planted",
        env={
            "ENGINE": "synthetic",
            "MODEL_NAME": MODEL,
            "SYNTHETIC_TOKENS": "5",
            "SLOTS": "1",  # one leaked slot would stop it for good
            "PYTHONPATH": str(tmp_path),  # `evil` is importable: it must never be imported
            "PLANTED_MARKS": str(marks),
        },
    )
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        yield base, redis.Redis.from_url(url), worker, marks, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        for p in (worker, api, redis_proc):
            p.stop()


def test_a_worker_acts_on_nothing_planted(planted_stack):
    base, r, worker, marks, hooks = planted_stack
    pid = worker.pid
    Webhooks.seen.clear()
    webhook = json.dumps(
        [{"url": f"{hooks}/hook", "events": ["failed", "finished"], "method": "POST", "timeout": 5}]
    )
    # a victim: another client's queued job (its worker would be fenced by a hijack)
    victim = httpx.post(
        base + "/v1/chat/completions",
        json={
            "model": "synthetic-nobody",
            "messages": [{"role": "user", "content": "x"}],
            "background": True,
        },
    )
    plant(r, "victim-job", queue=keys.queue_key("synthetic-other"))  # never this worker's
    spec = {"id": "x", "kind": "chat", "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

    forbidden = data("evil.fn", [{}])
    plant(r, "c01", data=forbidden, failure_callback_name="evil.on_failure")
    plant(r, "c02", data=forbidden, webhooks=webhook)
    plant(
        r, "c03", data=data(JOB_FUNCTION, [spec]), success_callback_name="evil.on_success", webhooks=webhook
    )
    plant(
        r,
        "c04",
        data=forbidden,
        retries_left="3",
        retry_intervals="[]",
        failure_callback_name="evil.on_failure",
    )
    plant(r, "c05", data=forbidden)
    r.sadd("rq:job:c05:dependents", "dep1")
    r.hset(
        "rq:job:dep1",
        mapping={
            "data": data("evil.fn", []),
            "origin": "other",
            "status": "deferred",
            "allow_dependency_failures": "1",
        },
    )
    plant(r, "c06", data=forbidden, rate_limit_key="k", rate_limit_concurrency="1")
    r.sadd("rq:rl:k:rate_limited", "c06-victim")
    plant(r, "c07", data=forbidden, group_id="nogroup", failure_ttl="0")
    plant(r, "c08", data=forbidden, status="bogus", timeout="1h", created_at="yesterday", enqueued_at="?")
    plant(r, "c09", data=data(JOB_FUNCTION, [spec], {"extra": 1}), repeats_left="2", result_ttl="-1")
    plant(r, "c10", data=zlib.compress(b"[" * 200 + b" " * 50_000_000), meta="\xff not json")
    plant(
        r, "c11", data=data(JOB_FUNCTION, [{**spec, "id": victim.json()["id"]}]), timeout="100000000000000000"
    )
    plant(r, "c12", data=data(JOB_FUNCTION, [spec]), stopped_callback_name="evil.on_stopped")
    r.rpush(QUEUE, "bad.id", "c03:rerun", "")  # ids RQ refuses, or parses into another job
    r.rpush(QUEUE, "c13")  # an id whose record is gone (its job ended while queued)
    # RQ's maintenance and pub/sub: registries and channels anyone with rq:* access can write
    r.zadd(f"rq:wip:{MODEL}", {"wip-job": 1})
    r.hset(
        "rq:job:wip-job",
        mapping={"data": forbidden, "status": "started", "failure_callback_name": "evil.on_failure"},
    )
    r.zadd(f"rq:ready:{MODEL}", {"ready-job": 1})
    r.hset("rq:job:ready-job", mapping={"data": forbidden, "status": "ready_to_enqueue", "origin": MODEL})
    r.sadd("rq:rl-keys", "k")
    r.publish("rq:pubsub:w-planted", json.dumps({"command": "shutdown"}))

    deadline = time.monotonic() + 30
    while r.llen(QUEUE) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.llen(QUEUE) == 0, r.lrange(QUEUE, 0, -1)  # every planted id was taken...
    answer = httpx.post(  # ...and a legitimate request is served by the same worker
        base + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == " w0 w1 w2 w3 w4"
    assert worker.alive() and worker.pid == pid

    assert sorted(p.name for p in marks.iterdir()) == []  # nothing imported, nothing called
    assert Webhooks.seen == []  # no request made
    assert r.llen(keys.queue_key("other")) == 0 and not r.exists("rq:queue:other")  # nothing enqueued
    assert r.hget(keys.job(victim.json()["id"]), JobField.EPOCH) == b"0"  # the hijack claimed nothing
    assert not r.exists(keys.inbox("w-planted"))  # no job left half-taken
    for job_id in ("c01", "c02", "c03", "c04", "c05", "c06", "c07", "c08", "c09", "c10", "c11", "c12"):
        assert not r.exists(keys.rq_job(job_id)), job_id  # refused, and its record dropped
    log = worker.log()
    assert log.count("refused job") >= 12 and "Traceback" not in log
    assert "job c13 is gone" in log  # skipped, and its slot freed for the request above
    assert Path(worker.log_path).exists()
