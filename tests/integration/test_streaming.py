"""Chat and legacy completions streamed through the queue, checked on the raw bytes."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract import entries, keys
from contract.entries import Delta, Finished, Started
from devstack.sse_contract import check_stream
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration


def stream(client, path: str, body: dict) -> tuple[bytes, dict]:
    with client.stream("POST", path, json={"model": MODEL, "stream": True, **body}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        assert resp.headers["x-accel-buffering"] == "no"
        return resp.read(), dict(resp.headers)


def published(stack, job_id: str) -> list:
    return [entries.decode(f) for _, f in stack.streams.xrange(keys.events(job_id))]


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_contract(stack, client, include_usage):
    body = {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24,
        "temperature": 0,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    raw, _ = stream(client, "/v1/chat/completions", body)
    parsed = check_stream(raw, "chat", include_usage=include_usage)
    assert parsed.error is None and parsed.text.strip()
    assert parsed.finish_reason in ("stop", "length")
    # What the client got is exactly what the worker published, token ids included.
    events = published(stack, parsed.chunks[0]["id"])
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.text for d in deltas) == parsed.text
    assert sum(len(d.token_ids) for d in deltas) == events[-1].completion_tokens
    if include_usage:
        assert parsed.usage["completion_tokens"] == events[-1].completion_tokens
        assert parsed.usage["prompt_tokens"] == events[0].prompt_tokens


def test_max_tokens_ends_with_length(client):
    raw, _ = stream(
        client,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
            "max_tokens": 5,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    )
    parsed = check_stream(raw, "chat", include_usage=True)
    assert parsed.finish_reason == "length" and parsed.usage["completion_tokens"] == 5


def test_ignore_eos_generates_exactly_max_tokens(client):
    """A question the model answers in a word or two: it would stop at its end token, but with
    `ignore_eos` (llama-server's extension) it generates max_tokens, as benchmarks need."""
    body = {
        "messages": [{"role": "user", "content": "Reply with the single word: yes"}],
        "max_tokens": 48,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    raw, _ = stream(client, "/v1/chat/completions", body)
    short = check_stream(raw, "chat", include_usage=True)
    assert short.finish_reason == "stop" and short.usage["completion_tokens"] < 48
    raw, _ = stream(client, "/v1/chat/completions", {**body, "ignore_eos": True})
    full = check_stream(raw, "chat", include_usage=True)
    assert full.finish_reason == "length" and full.usage["completion_tokens"] == 48


def test_stop_string_is_cut_and_ends_with_stop(client):
    raw, _ = stream(
        client,
        "/v1/completions",
        {
            "prompt": "1, 2, 3, 4, 5,",
            "max_tokens": 40,
            "temperature": 0,
            "stop": [" 9"],
        },
    )
    parsed = check_stream(raw, "text")
    assert parsed.finish_reason == "stop"
    assert " 9" not in parsed.text and "8" in parsed.text


def test_legacy_completion_stream_contract(client):
    raw, _ = stream(
        client,
        "/v1/completions",
        {
            "prompt": ["The capital of France is"],
            "max_tokens": 12,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    )
    parsed = check_stream(raw, "text", include_usage=True)
    assert parsed.text and parsed.usage["completion_tokens"] <= 12


def test_non_streaming_chat_and_legacy(client):
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "Hi!"}]},
            ],
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    obj = r.json()
    assert obj["object"] == "chat.completion" and obj["id"].startswith("chatcmpl-")
    choice = obj["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    assert obj["usage"]["total_tokens"] == obj["usage"]["prompt_tokens"] + obj["usage"]["completion_tokens"]

    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8})
    obj = r.json()
    assert r.status_code == 200 and obj["object"] == "text_completion"
    assert obj["choices"][0]["finish_reason"] == "length" and obj["usage"]["completion_tokens"] == 8


def test_multibyte_text_is_never_split_across_deltas(stack, client):
    raw, _ = stream(
        client,
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "Translate to Japanese: good morning, thank you, bus station"}
            ],
            "max_tokens": 60,
            "temperature": 0,
        },
    )
    parsed = check_stream(raw, "chat")
    assert any(ord(ch) > 0x7F for ch in parsed.text), f"expected non-ASCII output, got {parsed.text!r}"
    assert all("\ufffd" not in d for d in parsed.deltas)
    # Each delta's text is the exact decoding of its own token ids' bytes (no carry-over).
    events = published(stack, parsed.chunks[0]["id"])
    multi = [e for e in events if isinstance(e, Delta) and len(e.token_ids) > 1]
    assert multi, "SmolLM2 splits Japanese characters across tokens; some delta must hold several"


def test_seed_makes_sampling_repeatable(client):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a word."}],
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 1234,
    }
    a = client.post("/v1/chat/completions", json=body).json()
    b = client.post("/v1/chat/completions", json=body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_stream_events_are_delivered_as_generated(client):
    """Chunks arrive one by one (not buffered to the end): the body is read incrementally."""
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 40,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Write a long sentence about rivers."}],
    }
    reads = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        for _ in resp.iter_raw():
            reads += 1
    assert reads > 5


def test_models_and_health(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (entry,) = [m for m in models["data"] if m["id"] == MODEL]
    assert entry["object"] == "model" and entry["workers"] >= 1
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert client.get("/v1/models/nope").status_code == 404
    for path in ("/health", "/healthz"):
        assert client.get(path).json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_metrics_show_the_slots_and_what_the_batching_worker_did(client):
    def figures() -> dict[str, float]:
        text = client.get("/metrics").text
        return {
            s.name: s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.labels.get("model") == MODEL
        }

    before = figures()
    assert before["tokenspool_slots"] == 4  # the stack's worker runs the default SLOTS
    assert before["tokenspool_gpu_layers"] == 0  # on the CPU
    kv_per_token = 30 * 2 * 192 * 2  # SmolLM2: 30 layers, keys and values of 3 heads x 64, f16
    assert before["tokenspool_kv_cache_bytes"] == 4 * 4096 * kv_per_token  # SLOTS x N_CTX tokens
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    usage = client.post("/v1/chat/completions", json=body).json()["usage"]
    # The job was in one step per token (its prompt's, then each token fed back); the worker
    # adds its counts with each announcement (every 2 s).
    deadline = time.monotonic() + 15
    while True:
        after = figures()
        added = {name: after[name] - before[name] for name in after if name.startswith("tokenspool_batch_")}
        if added["tokenspool_batch_sequences_total"] >= usage["completion_tokens"]:
            break
        assert time.monotonic() < deadline, f"the job's steps were not counted: {added}"
        time.sleep(0.2)
    assert added["tokenspool_batch_steps_total"] >= 1
    assert added["tokenspool_batch_prefill_tokens_total"] >= 1  # its last prompt token at least
    assert "tokenspool_batch_moves_total" in added
