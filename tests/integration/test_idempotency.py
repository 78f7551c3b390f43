"""Idempotency-Key: a retried POST attaches to the job the first one made (a stream replays
from the start and follows live), a different body is a 422, and a key is scoped to the API
key's owner that sent it."""

from __future__ import annotations

import json
import threading
import uuid

import httpx
import pytest

from contract import keys
from devstack.processes import start_api
from devstack.sse_contract import check_stream
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration


def body(**kw) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": 40,
        "temperature": 0,
        **kw,
    }


def stream(client: httpx.Client, key: str, payload: dict, headers: dict | None = None) -> bytes:
    with client.stream(
        "POST", "/v1/chat/completions", json=payload, headers={"Idempotency-Key": key, **(headers or {})}
    ) as resp:
        assert resp.status_code == 200, resp.read()
        return resp.read()


def test_a_retry_while_the_first_runs_attaches_and_replays_from_the_start(stack, client):
    key = str(uuid.uuid4())
    payload = body(stream=True, stream_options={"include_usage": True})
    first: dict[str, bytes] = {}
    t = threading.Thread(target=lambda: first.update(raw=stream(stack.client(), key, payload)))
    t.start()
    second = stream(client, key, payload)
    t.join(timeout=120)
    a, b = check_stream(first["raw"], "chat", True), check_stream(second, "chat", True)
    assert a.chunks[0]["id"] == b.chunks[0]["id"]  # one job
    assert a.text == b.text and a.usage == b.usage and a.finish_reason == b.finish_reason
    # after the end, the same retry gets the whole stream again
    again = check_stream(stream(client, key, payload), "chat", True)
    assert again.chunks[0]["id"] == a.chunks[0]["id"] and again.text == a.text


def test_a_non_streaming_retry_gets_the_same_answer(client):
    key = str(uuid.uuid4())
    r1 = client.post("/v1/chat/completions", json=body(), headers={"Idempotency-Key": key})
    r2 = client.post("/v1/chat/completions", json=body(), headers={"Idempotency-Key": key})
    assert r1.status_code == r2.status_code == 200
    assert r1.json() == r2.json()


def test_the_same_key_with_another_body_is_a_422(client):
    key = str(uuid.uuid4())
    assert (
        client.post(
            "/v1/chat/completions", json=body(background=True), headers={"Idempotency-Key": key}
        ).status_code
        == 202
    )
    r = client.post(
        "/v1/chat/completions", json=body(background=True, max_tokens=41), headers={"Idempotency-Key": key}
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_key_reused"
    r = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "background": True},
        headers={"Idempotency-Key": key},
    )
    assert r.status_code == 422  # another endpoint is another request


@pytest.mark.parametrize("bad", ["", "x" * 256, "tab\there", "é"])
def test_a_malformed_key_is_a_400_and_nothing_is_enqueued(stack, client, bad):
    before = stack.job_keys()
    r = client.post("/v1/chat/completions", json=body(), headers={"Idempotency-Key": bad.encode()})
    assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key"
    assert stack.job_keys() == before


def test_a_key_is_its_owner_s_alone(stack, tmp_path):
    api, base = start_api(tmp_path, stack.redis_url, env={"API_KEYS": "alice-key,bob-key", **stack.env})
    try:
        key = str(uuid.uuid4())
        payload = body(background=True)

        def post(api_key: str) -> httpx.Response:
            return httpx.post(
                base + "/v1/chat/completions",
                json=payload,
                headers={"Idempotency-Key": key, "Authorization": f"Bearer {api_key}"},
            )

        alice, bob, alice_again = post("alice-key"), post("bob-key"), post("alice-key")
        assert alice.status_code == bob.status_code == alice_again.status_code == 202
        assert alice.json()["id"] == alice_again.json()["id"] != bob.json()["id"]
        # bob's retry never reaches alice's job, nor can he read it
        stolen = httpx.get(
            f"{base}/v1/chat/completions/{alice.json()['id']}", headers={"Authorization": "Bearer bob-key"}
        )
        assert stolen.status_code == 404
    finally:
        api.stop()


def test_the_key_is_recorded_with_the_job(stack, client):
    key = str(uuid.uuid4())
    job_id = client.post(
        "/v1/chat/completions", json=body(background=True), headers={"Idempotency-Key": key}
    ).json()["id"]
    idem_key = stack.streams.hget(keys.job(job_id), "idem").decode()
    held, _, digest = stack.redis.get(idem_key).decode().partition(" ")
    assert held == job_id and len(digest) == 64
    assert 0 < stack.redis.ttl(idem_key) <= 86_400
    assert json.loads(stack.streams.hget(keys.job(job_id), "spec"))["id"] == job_id
