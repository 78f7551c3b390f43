"""Bad requests get an OpenAI-style error with the right status, and nothing is enqueued."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _with(**kw):
    return json.dumps({**CHAT, **kw}).encode()


BAD = [
    ("/v1/chat/completions", b"{oops", 400, None),
    ("/v1/chat/completions", b"", 400, None),
    ("/v1/chat/completions", json.dumps({"messages": CHAT["messages"]}).encode(), 400, "model"),
    ("/v1/chat/completions", _with(messages=[]), 400, "messages"),
    ("/v1/chat/completions", _with(messages=[{"role": "user"}, {"content": "x"}]), 400, "messages"),
    ("/v1/chat/completions", _with(max_tokens=0), 400, "max_tokens"),
    ("/v1/chat/completions", _with(max_tokens="ten"), 400, "max_tokens"),
    ("/v1/chat/completions", _with(temperature=-1), 400, "temperature"),
    ("/v1/chat/completions", _with(top_p=2), 400, "top_p"),
    ("/v1/chat/completions", _with(n=3), 400, "n"),
    ("/v1/chat/completions", _with(stream_options={"include_usage": True}), 400, "stream_options"),
    ("/v1/chat/completions", _with(cache_salt=""), 400, "cache_salt"),
    ("/v1/chat/completions", _with(cache_salt="x" * 257), 400, "cache_salt"),
    ("/v1/chat/completions", _with(cache_salt=7), 400, "cache_salt"),
    ("/v1/chat/completions", _with(model="no-such-model"), 404, "model"),
    ("/v1/completions", json.dumps({"model": MODEL}).encode(), 400, "prompt"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["a", "b"]}).encode(), 400, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD)
def test_bad_input_is_refused_and_nothing_is_enqueued(stack, client, path, body, status, param):
    before = (stack.queued(), stack.job_keys())
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error"
    if param:
        assert err["param"] and err["param"].startswith(param)
    if status == 404:
        assert err["code"] == "model_not_found"
    assert (stack.queued(), stack.job_keys()) == before


def test_body_over_the_limit_is_413(stack, client):
    before = stack.job_keys()
    huge = _with(messages=[{"role": "user", "content": "x" * 1_100_000}])
    r = client.post("/v1/chat/completions", content=huge, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # also without a Content-Length header (chunked upload)
    chunked = iter([huge[:600_000], huge[600_000:]])
    r = client.post("/v1/chat/completions", content=chunked, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert stack.job_keys() == before


def test_unknown_route_and_method_get_json_errors(client):
    r = client.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()
