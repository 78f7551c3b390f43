"""Hardening, through real processes: request limits, the job deadline, per-key limits, key
rotation from a file, CORS, purging a running completion, and what the logs never hold."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from contract import keys
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream

pytestmark = pytest.mark.integration

MODEL = "synthetic-hard"
SECRET_PROMPT = "the-secret-prompt-7f3a"


@dataclass
class Hard:
    base: str
    r: redis.Redis
    key_file: Path
    procs: list[Proc]

    def client(self, key: str = "key-a", **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60, headers={"Authorization": f"Bearer {key}"}, **kw)


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> Iterator[Hard]:
    logs = tmp_path_factory.mktemp("hard")
    key_file = logs / "keys"
    key_file.write_text("key-a\nkey-s\nsha256:" + hashlib.sha256(b"key-b").hexdigest() + "\n")
    redis_proc, url = start_redis(logs)
    api, base = start_api(
        logs,
        url,
        env={
            "API_KEYS_FILE": str(key_file),
            "CORS_ORIGINS": "https://app.example",
            "MAX_MESSAGES": "3",
            "MAX_PROMPT_CHARS": "200",
            "MAX_TOKENS_LIMIT": "50",
            "MAX_STOP": "2",
            "MAX_STOP_CHARS": "8",
            "MAX_JOBS_PER_KEY": "2",
            "MAX_STREAMS_PER_KEY": "3",
            "JOB_DEADLINE_SECONDS": "3",
            "KNOWN_MODELS": "synthetic-nobody",
            "KEEPALIVE_SECONDS": "0.5",
        },
    )
    worker = start_worker(
        logs,
        url,
        env={"ENGINE": "synthetic", "MODEL_NAME": MODEL, "SYNTHETIC_TOKENS": "40", "SYNTHETIC_RATE": "10"},
    )
    h = Hard(base, redis.Redis.from_url(url), key_file, [worker, api, redis_proc])
    try:
        wait_for_model(base, MODEL, procs=(api, worker), headers={"Authorization": "Bearer key-a"})
        yield h
    finally:
        for p in h.procs:
            p.stop()


def chat(content: str = "hi", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize(
    "body, param, code",
    [
        (chat(messages=[{"role": "user", "content": "x"}] * 4), "messages", "array_above_max_length"),
        (chat("y" * 201), "messages", "string_above_max_length"),
        (chat(stop=["a", "b", "c"]), "stop", "array_above_max_length"),
        (chat(stop="123456789"), "stop", "string_above_max_length"),
    ],
)
def test_limits_give_openai_errors_and_enqueue_nothing(hard, body, param, code):
    before = hard.r.llen(f"rq:queue:{MODEL}")
    with hard.client() as c:
        resp = c.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param and resp.json()["error"]["code"] == code
    assert hard.r.llen(f"rq:queue:{MODEL}") == before


def test_a_max_tokens_above_the_limit_is_clamped_on_chat_and_refused_on_legacy_completions(hard):
    """opencode's 32,000 on chat completions (docs/requests.md, "Answer length"): the stream
    starts (its 40 words outlast the deadline; a refusal would come before it)."""
    with hard.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=chat(max_tokens=51, stream=True)) as clamped:
            assert clamped.status_code == 200
        legacy = c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 51})
    assert legacy.status_code == 400 and legacy.json()["error"]["param"] == "max_tokens"


def test_job_deadline_ends_a_long_generation_with_an_error(hard):
    with hard.client() as c, c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as resp:
        raw = resp.read()  # 40 words at 10/s would take 4 s; the deadline is 3 s
    parsed = check_stream(raw, "chat")
    assert parsed.error is not None and parsed.error["code"] == "deadline_exceeded"
    assert parsed.text.startswith(" w0 w1")
    with hard.client() as c:
        resp = c.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "deadline_exceeded"


def test_per_key_job_limit(hard):
    with hard.client() as c, hard.client("key-b") as other:
        ids = [c.post("/v1/chat/completions", json=chat(background=True)).json()["id"] for _ in range(2)]
        refused = c.post("/v1/chat/completions", json=chat(background=True))
        assert refused.status_code == 429 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert other.post("/v1/chat/completions", json=chat(background=True)).status_code == 202
        for job_id in ids:
            c.post(f"/v1/chat/completions/{job_id}/cancel")
        deadline = time.monotonic() + 15
        while c.post("/v1/chat/completions", json=chat(background=True, max_tokens=1)).status_code == 429:
            assert time.monotonic() < deadline, "ended jobs still count against the key"
            time.sleep(0.2)


def test_per_key_stream_limit(hard):
    # three open resumed streams of a queued job for a model with no worker (own key: the
    # other tests' jobs do not count against it)
    with hard.client("key-s") as c:
        job_id = c.post(
            "/v1/chat/completions", json={**chat(background=True), "model": "synthetic-nobody"}
        ).json()["id"]
        url = f"/v1/chat/completions/{job_id}?stream=true"
        streams = [c.stream("GET", url) for _ in range(3)]
        opened = [s.__enter__() for s in streams]
        try:
            assert all(r.status_code == 200 for r in opened)
            time.sleep(0.3)  # each stream counts from its first event on
            extra = c.get(url)
            assert extra.status_code == 429 and extra.json()["error"]["code"] == "too_many_streams"
        finally:
            for s in streams:
                s.__exit__(None, None, None)
        hard.r.delete(keys.job(job_id))  # nothing would ever run it


def test_key_file_rotation(hard):
    with hard.client("key-c") as c:
        assert c.get("/v1/models").status_code == 401
    hard.key_file.write_text("key-a\nkey-c\n")
    os.utime(hard.key_file, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    time.sleep(1.2)  # re-read at most once a second
    with hard.client("key-c") as c, hard.client("key-b") as b:
        assert c.get("/v1/models").status_code == 200
        assert b.get("/v1/models").status_code == 401  # rotated out
    api_log = hard.procs[1].log()
    assert "key-c" not in api_log and "key-a" not in api_log


def test_cors_only_for_configured_origins(hard):
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(hard.base + "/v1/chat/completions", headers={"Origin": "https://app.example", **pre})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
    bad = httpx.options(hard.base + "/v1/chat/completions", headers={"Origin": "https://evil.example", **pre})
    assert "access-control-allow-origin" not in bad.headers


def test_purge_of_a_running_completion(hard):
    job_id = None
    with hard.client() as c, c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as resp:
        raw = b""
        for chunk in resp.iter_bytes():
            raw += chunk
            if job_id is None and b'"content":" w2"' in raw:
                job_id = re.search(rb'"id":"(chatcmpl-[^"]+)"', raw).group(1).decode()
                deleted = c.delete(f"/v1/chat/completions/{job_id}")
                assert deleted.json() == {"id": job_id, "object": "chat.completion.deleted", "deleted": True}
    parsed = check_stream(raw, "chat")
    assert parsed.error is not None and parsed.error["code"] == "not_found"
    assert not hard.r.exists(keys.job(job_id), keys.events(job_id))
    with hard.client() as c:
        assert c.get(f"/v1/chat/completions/{job_id}").status_code == 404


def test_prompts_and_completions_are_not_logged(hard):
    with hard.client() as c:
        c.post("/v1/chat/completions", json=chat(SECRET_PROMPT, max_tokens=3))
    for p in hard.procs[:2]:
        assert SECRET_PROMPT not in p.log()
        assert " w1 w2" not in p.log()
