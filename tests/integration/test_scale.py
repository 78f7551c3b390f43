"""Operating a pool: synthetic workers, known models that scale from zero, queue limits,
idle exit, /metrics, /scaling and JSON logs that follow a completion from API to worker.

Workers here run the synthetic engine (no model to load), through the same job runner and
publisher as the real one; the deterministic words it emits (" w0 w1 ...") make the text of a
completion exact, even across a worker kill.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream

pytestmark = pytest.mark.integration

SERVED = "synthetic-a"  # has workers in these tests
COLD = "synthetic-cold"  # a known model: accepted with no worker, scales from zero
WORDS = 12


def words(n: int, start: int = 0) -> str:
    return "".join(f" w{i}" for i in range(start, n))


@dataclass
class Pool:
    logs: Path
    url: str
    base: str
    r: redis.Redis
    procs: list[Proc] = field(default_factory=list)
    n: int = 0

    def worker(self, model: str = SERVED, **env: str) -> Proc:
        self.n += 1
        proc = start_worker(
            self.logs,
            self.url,
            name=f"syn{self.n}",
            env={
                "ENGINE": "synthetic",
                "MODEL_NAME": model,
                "SYNTHETIC_TOKENS": str(WORDS),
                "SYNTHETIC_RATE": "200",
                "HEARTBEAT_WINDOW_SECONDS": "2",
                **env,
            },
        )
        self.procs.append(proc)
        return proc

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=60)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        text = httpx.get(self.base + "/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    logs = tmp_path_factory.mktemp("scale")
    redis_proc, url = start_redis(logs)
    api, base = start_api(
        logs,
        url,
        env={
            "KNOWN_MODELS": COLD,
            "QUEUE_LIMITS": f"{COLD}=2",
            "RETRY_AFTER_SECONDS": "7",
            "KEEPALIVE_SECONDS": "0.5",
            "REAPER_INTERVAL_SECONDS": "0.2",
            "REAPER_SETTLE_SECONDS": "0",
            "CANCEL_GRACE_SECONDS": "0",
        },
    )
    p = Pool(logs, url, base, redis.Redis.from_url(url), [api, redis_proc])
    p.worker()
    wait_for_model(base, SERVED, procs=tuple(p.procs))
    try:
        yield p
    finally:
        for proc in reversed(p.procs):
            proc.stop()


def chat(model: str = SERVED, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi there"}], **extra}


def stream(client: httpx.Client, body: dict) -> tuple[bytes, str]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        raw = resp.read()
    parsed = check_stream(raw, "chat")
    return raw, parsed.chunks[0]["id"]


def test_synthetic_worker_streams_through_the_real_publish_path(pool):
    with pool.client() as c:
        raw, _ = stream(c, chat())
        parsed = check_stream(raw, "chat")
        assert parsed.text == words(WORDS) and parsed.finish_reason == "stop"
        raw, _ = stream(c, chat(max_tokens=3))
        parsed = check_stream(raw, "chat")
        assert parsed.text == words(3) and parsed.finish_reason == "length"


def test_synthetic_engine_refuses_a_real_model_name(pool):
    proc = pool.worker(model="SmolLM2-135M-Instruct")
    assert proc.popen.wait(30) != 0
    assert "serves only model names starting with 'synthetic'" in proc.log()


def test_models_lists_live_and_known_models(pool):
    with pool.client() as c:
        data = {m["id"]: m["workers"] for m in c.get("/v1/models").json()["data"]}
        assert data[SERVED] >= 1 and data[COLD] == 0
        assert c.get(f"/v1/models/{COLD}").json()["workers"] == 0
        resp = c.post("/v1/chat/completions", json=chat("synthetic-nobody"))
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_known_model_waits_in_the_queue_then_a_full_queue_is_refused(pool):
    with pool.client() as c:
        accepted = [c.post("/v1/chat/completions", json=chat(COLD, background=True)) for _ in range(2)]
        assert [r.status_code for r in accepted] == [202, 202]
        assert pool.r.llen(f"rq:queue:{COLD}") == 2
        scaling = c.get(f"/scaling/{COLD}").json()
        assert scaling == {
            "model": COLD,
            "queued": 2,
            "in_flight": 0,
            "workers": 0,
            "slots": 0,
            "demand": 2,
            "batch_queued": 0,
            "batch_in_flight": 0,
            "interactive_demand": 2,
            "queued_by_tier": {"suspect": 0, "priority": 0, "default": 2, "flex": 0, "batch": 0},
        }

        refused = c.post("/v1/chat/completions", json=chat(COLD, stream=True))
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "7"
        assert refused.json()["error"]["code"] == "queue_full"
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        assert pool.r.llen(f"rq:queue:{COLD}") == 2  # nothing enqueued

        pool.worker(model=COLD)  # scale from zero: the waiting jobs run
        for r in accepted:
            job_id = r.json()["id"]
            deadline = time.monotonic() + 30
            while (got := c.get(f"/v1/chat/completions/{job_id}")).status_code == 202:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert got.json()["choices"][0]["message"]["content"] == words(WORDS)
        assert pool.metrics()[("tokenspool_requests_rejected_total", (("reason", "queue_full"),))] >= 1


def test_idle_worker_exits_and_leaves_the_pool(pool):
    proc = pool.worker(model="synthetic-idle", IDLE_EXIT_SECONDS="1")
    wait_for_model(pool.base, "synthetic-idle", procs=(proc,))
    assert proc.popen.wait(30) == 0
    assert "scale to zero" in proc.log()
    models = {m["id"] for m in httpx.get(pool.base + "/v1/models").json()["data"]}
    assert "synthetic-idle" not in models


def test_metrics_count_what_happened(pool):
    before = pool.metrics()
    with pool.client() as c:
        for _ in range(3):
            stream(c, chat())
    after = pool.metrics()
    tokens = ("tokenspool_tokens_generated_total", (("model", SERVED),))
    assert after[tokens] - before.get(tokens, 0) == 3 * WORDS
    count = ("tokenspool_time_to_first_token_seconds_count", (("model", SERVED),))
    assert after[count] - before.get(count, 0) == 3
    itl = ("tokenspool_inter_token_latency_seconds_count", (("model", SERVED),))
    assert after[itl] - before.get(itl, 0) == 3 * (WORDS - 1)
    assert after[("tokenspool_workers", (("model", SERVED),))] >= 1
    assert after[("tokenspool_streams_open", ())] == 0
    assert ("tokenspool_queue_depth", (("model", SERVED),)) in after


def test_slots_of_the_live_workers_are_summed_and_leave_with_them(pool):
    model = "synthetic-slots"
    three, two = pool.worker(model=model, SLOTS="3"), pool.worker(model=model, SLOTS="2")
    key = ("tokenspool_slots", (("model", model),))
    deadline = time.monotonic() + 30
    while pool.metrics().get(key) != 5:
        assert time.monotonic() < deadline and three.alive() and two.alive()
        time.sleep(0.2)
    assert httpx.get(f"{pool.base}/scaling/{model}").json()["slots"] == 5
    two.stop()  # a graceful stop withdraws its slots at once
    assert pool.metrics()[key] == 3
    three.stop()


def test_logs_carry_the_completion_id_from_api_to_worker(pool):
    with pool.client() as c:
        _, job_id = stream(c, chat())

    def tagged(proc: Proc) -> list[dict]:
        lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
        return [entry for entry in lines if entry.get("completion_id") == job_id]

    api = pool.procs[0]
    assert any("enqueued" in e["msg"] for e in tagged(api))
    workers = [p for p in pool.procs[2:] if p.name.startswith("syn")]
    assert any(tagged(w) for w in workers)
    assert "hi there" not in api.log()  # prompts are not logged


def test_kill_mid_stream_resumes_exactly_and_counts_the_crash(pool):
    for p in pool.procs[2:]:
        p.stop()
    slow = {"SYNTHETIC_RATE": "20", "SYNTHETIC_TOKENS": "40"}
    first = pool.worker(**slow)
    wait_for_model(pool.base, SERVED, procs=(first,))
    before = pool.metrics().get(("tokenspool_attempts_requeued_total", (("reason", "crash"),)), 0)
    with pool.client() as c, c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as resp:
        raw = b""
        for chunk in resp.iter_bytes():
            raw += chunk
            if raw.count(b'"content":" w') >= 10 and first.alive():
                first.signal(signal.SIGKILL)
                pool.worker(**slow)
    parsed = check_stream(raw, "chat")
    assert parsed.text == words(40) and parsed.finish_reason == "stop"
    after = pool.metrics()[("tokenspool_attempts_requeued_total", (("reason", "crash"),))]
    assert after - before == 1
