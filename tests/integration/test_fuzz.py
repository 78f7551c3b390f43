"""Schemathesis against the running API, driven by its own /openapi.json: whatever it sends,
no 5xx, no hang, an OpenAI-style error for every refusal, and nothing enqueued or stored for
a request that was refused. A synthetic worker serves one model, so valid requests run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from devstack.peek import job_ids
from devstack.processes import start_api, start_redis, start_worker, wait_for_model

pytestmark = pytest.mark.integration

MODEL = "synthetic-fuzz"


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory) -> Iterator[tuple[str, redis.Redis]]:
    logs = tmp_path_factory.mktemp("fuzz")
    redis_proc, url = start_redis(logs)
    api, base = start_api(logs, url, env={"KEEPALIVE_SECONDS": "1", "MAX_BODY_BYTES": "20000"})
    worker = start_worker(
        logs,
        url,
        env={"ENGINE": "synthetic", "MODEL_NAME": MODEL, "SYNTHETIC_TOKENS": "4", "SYNTHETIC_RATE": "0"},
    )
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        yield base, redis.Redis.from_url(url)
    finally:
        for p in (worker, api, redis_proc):
            p.stop()


def served(case):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    return case


def stored(r: redis.Redis) -> tuple[int, int]:
    jobs = len(job_ids(r))
    return jobs, r.llen(f"rq:queue:{MODEL}")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_api_never_fails_or_hangs(fuzz_stack, mode):
    """Every operation of /openapi.json, with valid (positive) and invalid (negative) data.
    (Driven through hypothesis directly: schemathesis' pytest plugin does not run on pytest 9.)"""
    base, r = fuzz_stack
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    seen: dict[int, int] = {}
    ran: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        strategy = operation.as_strategy(generation_mode=mode)
        if mode is GenerationMode.POSITIVE and operation.method.upper() == "POST":
            strategy = strategy.map(served)  # valid bodies for the served model: they run

        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case):
            before = stored(r)
            response = case.call(base_url=base, timeout=30)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            if case.method.upper() == "POST" and response.status_code in (200, 202):
                ran.append(case.formatted_path)
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
            if response.status_code >= 400 and case.formatted_path.startswith("/v1/messages"):
                body = response.json()  # Anthropic's shape on Anthropic's endpoint
                assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
            elif response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            if response.status_code >= 400 and case.method.upper() == "POST":
                jobs, queued = stored(r)
                assert jobs <= before[0] and queued <= before[1], "a refused request left a job"

        run()
    assert any(code >= 400 for code in seen)
    if mode is GenerationMode.POSITIVE:
        assert "/v1/chat/completions" in ran and "/v1/completions" in ran  # valid requests ran
