"""Every failure still ends the stream properly: errors from the worker, a job no worker
starts in time (with keep-alives meanwhile), Redis lost, the client gone, a planted job."""

from __future__ import annotations

import json
import signal
import time
import zlib

import httpx
import openai
import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from contract import entries, keys
from contract.entries import Finished
from devstack.processes import start_api, start_redis
from devstack.sse_contract import check_stream, read_opening
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

LONG_PROMPT = "hello " * 5000  # more tokens than the worker's 4096-token context


def test_prompt_too_long_streams_an_error_then_done(client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        raw = resp.read()
    parsed = check_stream(raw, "chat")
    assert parsed.error["code"] == "context_length_exceeded"
    assert parsed.error["type"] == "invalid_request_error" and parsed.error["param"] == "messages"
    assert "4096" in parsed.error["message"]


def test_prompt_too_long_without_streaming_is_400(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": LONG_PROMPT})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_the_worker_survives_errors_and_serves_the_next_job(client):
    client.post("/v1/completions", json={"model": MODEL, "prompt": LONG_PROMPT})
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_openai_sdk_raises_the_streamed_error(stack):
    sdk = openai.OpenAI(base_url=stack.base + "/v1", api_key="x", max_retries=0)
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}], stream=True
    )
    with pytest.raises(openai.APIError) as info:
        list(stream)
    assert "maximum context length" in info.value.message


# --- a model with no running worker: its own Redis and API, and a fake announcement ---

GHOST = "ghost-model"


@pytest.fixture
def lonely_api(tmp_path):
    """An API whose model was announced but whose worker never takes the job."""
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(
        tmp_path,
        url,
        env={"KEEPALIVE_SECONDS": "0.3", "QUEUE_WAIT_SECONDS": "3", "STREAM_OUTAGE_SECONDS": "2"},
    )
    r = redis.Redis.from_url(url)
    r.sadd(keys.MODELS, GHOST)
    r.zadd(keys.workers(GHOST), {"phantom": int(time.time() * 1000)})
    try:
        yield base, r, redis_proc
    finally:
        api.stop()
        redis_proc.stop()


def test_queued_job_gets_keepalives_the_sdk_parses_then_queue_timeout(lonely_api):
    base, r, _ = lonely_api
    sdk = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    stream = sdk.chat.completions.create(
        model=GHOST, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    seen = []
    started = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            seen.append(chunk)
    elapsed = time.monotonic() - started
    assert "in time" in info.value.message
    assert 2.5 < elapsed < 10
    assert seen[0].choices[0].delta.role == "assistant"
    keepalives = [c for c in seen[1:] if c.choices[0].delta.content is None]
    assert len(keepalives) >= 5, "keep-alives every 0.3 s while queued"
    job_id = seen[0].id
    assert_no_rq_record(r, job_id)


def assert_no_rq_record(r: redis.Redis, job_id: str) -> None:
    """A job that ended while queued leaves no request behind in RQ's record or queue."""
    assert not r.exists(keys.rq_job(job_id)), "RQ's record (the whole request) outlived the job"
    assert job_id.encode() not in r.lrange(f"rq:queue:{GHOST}", 0, -1)


def test_queued_job_raw_stream_ends_with_error_and_done(lonely_api):
    base, _, _ = lonely_api
    body = {"model": GHOST, "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as resp:
        raw = resp.read()
    parsed = check_stream(raw, "text", include_usage=True)
    assert parsed.error["code"] == "queue_timeout" and parsed.keepalives >= 5


def test_queue_timeout_without_streaming_is_503(lonely_api):
    base, _, _ = lonely_api
    r = httpx.post(base + "/v1/completions", json={"model": GHOST, "prompt": "hi"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout"


def test_redis_lost_mid_stream_ends_with_error_and_done(lonely_api):
    base, _, redis_proc = lonely_api
    body = {"model": GHOST, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as resp:
        it = resp.iter_raw()
        first = next(it)
        redis_proc.signal(signal.SIGKILL)
        started = time.monotonic()
        raw = first + b"".join(it)
    assert time.monotonic() - started < 8
    parsed = check_stream(raw, "chat")
    assert parsed.error["code"] == "service_unavailable"


def test_redis_down_gives_503_not_a_hang(lonely_api):
    base, _, redis_proc = lonely_api
    redis_proc.signal(signal.SIGKILL)
    redis_proc.popen.wait()
    started = time.monotonic()
    r = httpx.post(
        base + "/v1/chat/completions",
        json={"model": GHOST, "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "service_unavailable"
    assert time.monotonic() - started < 6
    assert httpx.get(base + "/readyz", timeout=30).status_code == 503
    assert httpx.get(base + "/health", timeout=30).status_code == 200


# --- the client goes away ---


def test_disconnect_cancels_the_job_and_frees_the_worker(stack, client):
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 2000,
        "temperature": 1.0,
        "seed": 5,
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        _, first = read_opening(lines)
        job_id = first["id"]
        for _ in range(10):
            next(lines)
    # the API (CANCEL_GRACE_SECONDS=0 here) flags the job; the worker stops at its next token
    deadline = time.monotonic() + 10
    final = None
    while time.monotonic() < deadline and final is None:
        rows = stack.streams.xrevrange(keys.events(job_id), count=1)
        last = entries.decode(rows[0][1]) if rows else None
        final = last if isinstance(last, Finished) else None
        time.sleep(0.05)
    assert final is not None and final.finish_reason == "cancelled"
    assert stack.streams.hget(keys.job(job_id), keys.JobField.STATUS) == b"cancelled"
    assert final.completion_tokens < 500
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


# --- a job planted in Redis by someone else ---


def _refused(stack, rq_job_id: str, timeout: float = 10) -> bool:
    """The worker took the planted job, ran nothing, and dropped it (its record deleted, the
    refusal logged)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            not stack.redis.exists(keys.rq_job(rq_job_id))
            and f"refused job '{rq_job_id}'" in stack.worker.log()
        ):
            return True
        time.sleep(0.05)
    return False


def test_planted_job_with_another_function_is_never_executed(stack, client, tmp_path):
    marker = tmp_path / "pwned"
    q = Queue(MODEL, connection=stack.redis, serializer=JSONSerializer)
    job = q.enqueue_call("pathlib.Path.touch", args=(str(marker),))
    assert _refused(stack, job.id)
    assert not marker.exists()
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_planted_job_with_malformed_arguments_fails_cleanly(stack, client):
    q = Queue(MODEL, connection=stack.redis, serializer=JSONSerializer)
    job = q.enqueue_call(keys.JOB_FUNCTION, args=({"id": "x", "prompt": 5},))
    deadline = time.monotonic() + 10
    while stack.redis.exists(keys.rq_job(job.id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stack.redis.exists(keys.rq_job(job.id))
    assert "refused job" in stack.worker.log() and "invalid arguments" in stack.worker.log()
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_cancelling_a_queued_job_ends_its_stream_at_once(lonely_api):
    base, r, _ = lonely_api
    body = {"model": GHOST, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as resp:
        lines = resp.iter_lines()
        first, opening = read_opening(lines)
        job_id = opening["id"]
        started = time.monotonic()
        cancelled = httpx.post(f"{base}/v1/chat/completions/{job_id}/cancel").json()
        raw = "".join(line + "\n" for line in [*first, *lines]).encode()
    assert cancelled == {"id": job_id, "object": "chat.completion", "status": "cancelled"}
    assert time.monotonic() - started < 2
    parsed = check_stream(raw, "chat")
    assert parsed.finish_reason == "stop" and parsed.text == ""
    assert_no_rq_record(r, job_id)


def test_job_is_enqueued_as_json_for_the_models_queue(lonely_api):
    base, r, _ = lonely_api
    job_id = httpx.post(
        base + "/v1/completions", json={"model": GHOST, "prompt": "x", "background": True}
    ).json()["id"]
    assert r.lrange(f"rq:queue:{GHOST}", 0, -1) == [job_id.encode()]
    job = r.hgetall(f"rq:job:{job_id}")
    func, instance, args, kwargs = json.loads(zlib.decompress(job[b"data"]))
    assert (func, instance, kwargs) == (keys.JOB_FUNCTION, None, {})
    assert args[0]["id"] == job_id and args[0]["model"] == GHOST and args[0]["prompt"] == "x"
