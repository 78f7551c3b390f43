"""Optional API keys: 401 with an OpenAI-style error; health probes stay open; keys never logged."""

from __future__ import annotations

import httpx
import openai
import pytest
import redis

from devstack.peek import job_ids
from devstack.processes import start_api, start_redis

pytestmark = pytest.mark.integration

KEYS = "sk-first-key,sk-second-key"


@pytest.fixture(scope="module")
def keyed_api(tmp_path_factory):
    logs = tmp_path_factory.mktemp("auth")
    redis_proc, url = start_redis(logs)
    api, base = start_api(logs, url, env={"API_KEYS": KEYS})
    try:
        yield base, api
    finally:
        api.stop()
        redis_proc.stop()


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("Bearer sk-wrong", "invalid_api_key"),
        ("Bearer sk-first-ke", "invalid_api_key"),
        ("Basic sk-first-key", "invalid_api_key"),
        ("Bearer", "invalid_api_key"),
    ],
)
def test_missing_or_wrong_key_is_401(keyed_api, header, code):
    base, _ = keyed_api
    headers = {"Authorization": header} if header else {}
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
        r = httpx.request(method, base + path, headers=headers, json={})
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["code"] == code and err["type"] == "invalid_request_error"
        assert "sk-first" not in r.text


@pytest.mark.parametrize("key", ["sk-first-key", "sk-second-key"])
def test_any_configured_key_is_accepted(keyed_api, key):
    base, _ = keyed_api
    assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    sdk = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    assert sdk.models.list().data == []


def test_probes_need_no_key(keyed_api):
    base, _ = keyed_api
    for path in ("/health", "/healthz", "/readyz"):
        assert httpx.get(base + path).status_code == 200


def test_keys_never_appear_in_logs(keyed_api):
    base, api = keyed_api
    httpx.get(base + "/v1/models", headers={"Authorization": "Bearer sk-first-key"})
    httpx.get(base + "/v1/models", headers={"Authorization": "Bearer sk-guess"})
    log = api.log()
    assert "sk-first-key" not in log and "sk-second-key" not in log and "sk-guess" not in log


def test_a_key_line_s_tiers_and_budget_are_kept_before_anything_is_enqueued(tmp_path):
    """API_KEYS_FILE: a key's line names the service tiers it may ask for and its own
    requests a minute (docs/security.md)."""
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-plain tiers=default,flex requests_per_minute=3\n")
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url, env={"API_KEYS_FILE": str(keys_file), "KNOWN_MODELS": "m"})
    try:
        headers = {"Authorization": "Bearer sk-plain"}
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
        refused = httpx.post(
            base + "/v1/chat/completions", headers=headers, json={**body, "service_tier": "priority"}
        )
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "tier_not_allowed"
        assert refused.json()["error"]["param"] == "service_tier"
        lines = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = httpx.post(base + "/v1/batches", headers=headers, json=lines)
        assert batch.status_code == 403 and batch.json()["error"]["code"] == "tier_not_allowed"
        r = redis.Redis.from_url(url)
        assert not r.keys("rq:queue:*") and not job_ids(r)  # nothing was enqueued
        sent = [
            httpx.post(base + "/v1/chat/completions", headers=headers, json={**body, "background": True})
            for _ in range(4)
        ]
        assert [r.status_code for r in sent] == [202, 202, 202, 429]  # its own tiers, and its own budget
        assert "3 requests" in sent[-1].json()["error"]["message"] and sent[-1].headers["retry-after"]
    finally:
        api.stop()
        redis_proc.stop()
