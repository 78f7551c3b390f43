"""Tokens per minute per key, through real processes: two API replicas hold one key's budget
together (contract/lua/accounting.py ADMIT in Redis), every response says where the key stands
in OpenAI's or Anthropic's headers, and a job is charged its usage once, however often it was
resumed or read."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
import redis

from api.http.auth import digest
from contract import entries, keys
from contract.entries import Started
from contract.lua import accounting
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL = "sk-alice-0123456789", "sk-bob-0123456789", "sk-carol-0123456789"
DAVE, ERIN = "sk-dave-0123456789", "sk-erin-0123456789"
LIMIT = 1000
IDLE = "scaled-to-zero"  # a KNOWN_MODELS model without workers
ASK = [{"role": "user", "content": "Tell me a story about a fox."}]


def owner(key: str) -> str:
    return digest(key)[:32]  # api/http/auth.py: a job's owner is a prefix of its key's SHA-256


@dataclass
class Pool:
    apis: list[str]
    r: redis.Redis
    workers: dict[str, Proc]

    def charged(self, key: str, minute: int) -> int:
        return int(self.r.get(keys.tokens_per_minute(owner(key), minute)) or 0)

    def reserved(self, key: str) -> dict:
        return self.r.hgetall(keys.owned(owner(key), keys.OwnerIndex.RESERVED_TOKENS))


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    """Two API replicas taking keys of LIMIT tokens a minute, and two workers of four slots (a
    killed one's job goes on on the other)."""
    logs = tmp_path_factory.mktemp("tokens")
    redis_proc, url = start_redis(logs)
    env = {
        "API_KEYS": ",".join((ALICE, BOB, CAROL, DAVE, ERIN)),
        "KEY_TOKENS_PER_MINUTE": str(LIMIT),
        "KNOWN_MODELS": IDLE,
        "KEEPALIVE_SECONDS": "0.5",
        "REAPER_INTERVAL_SECONDS": "0.2",
    }
    apis = [start_api(logs, url, name=f"api{i}", env=env) for i in range(2)]
    worker_env = {"SLOTS": "4", "HEARTBEAT_WINDOW_SECONDS": "2", "WARM_UP_SECONDS": "0"}
    workers = {n: start_worker(logs, url, name=n, env=worker_env) for n in ("w1", "w2")}
    try:
        procs = (*(p for p, _ in apis), *workers.values())
        wait_for_model(apis[0][1], MODEL, procs=procs, headers={"Authorization": f"Bearer {ALICE}"})
        r = redis.Redis.from_url(url)
        # what a pool scaled to zero keeps of its last worker: what its template adds to a prompt
        r.hset(keys.prompt_overhead(IDLE), keys.LAST_CONTEXT, "20 10")
        yield Pool([base for _, base in apis], r, workers)
    finally:
        for p in (*workers.values(), *(p for p, _ in apis), redis_proc):
            p.stop()


def fresh_minute(needed_s: float = 40) -> int:
    """The minute since the epoch, once at least `needed_s` of it are left (the budgets are
    counted per minute: a test that crossed into the next would see a fresh budget)."""
    left = 60 - time.time() % 60
    if left < needed_s:
        time.sleep(left + 0.05)
    return int(time.time() // 60)


def test_two_replicas_admit_no_more_than_a_key_s_tokens_a_minute_together(pool):
    """Jobs for a model scaled to zero: they wait in its queue, so none ends (and gives its
    unused tokens back) while the others are admitted."""
    minute = fresh_minute(20)
    body = {"model": IDLE, "messages": ASK, "max_tokens": 100, "background": True}

    def send(i: int) -> httpx.Response:
        return httpx.post(
            pool.apis[i % 2] + "/v1/chat/completions", json=body, headers=auth(ALICE), timeout=60
        )

    # one admitted on each replica first: under load the race below can admit all on one
    answers = [send(0), send(1)]
    with ThreadPoolExecutor(10) as threads:
        answers += list(threads.map(send, range(2, 12)))
    assert int(time.time() // 60) == minute, "the test outlasted its minute"
    admitted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 429]
    # each reserves its max_tokens and the most its prompt can be: the template's 20 and 10 for
    # its one message (announced), and a token a byte of its 28 characters, and one
    assert len(admitted) == LIMIT // 159 and len(refused) == 12 - len(admitted), [a.text for a in answers]
    assert {a.request.url.port for a in admitted} == {httpx.URL(b).port for b in pool.apis}  # both replicas
    for a in admitted:
        assert a.headers["x-ratelimit-limit-tokens"] == str(LIMIT)
        assert 0 <= int(a.headers["x-ratelimit-remaining-tokens"]) < LIMIT
        assert a.headers["x-ratelimit-reset-tokens"].endswith("s")
        assert a.headers["x-ratelimit-limit-requests"] == "600"
    no = refused[0].json()["error"]
    assert no["code"] == "rate_limit_exceeded" and "tokens per minute" in no["message"]
    assert int(refused[0].headers["x-ratelimit-remaining-tokens"]) < 159
    assert int(refused[0].headers["Retry-After"]) >= 1
    assert pool.charged(ALICE, minute) == 159 * len(admitted)


def test_a_key_is_charged_what_its_jobs_used_once_their_ends_are_read(pool):
    minute = fresh_minute(30)
    body = {"model": MODEL, "messages": ASK, "max_tokens": 16, "temperature": 0}
    usage = 0
    for base in pool.apis:
        resp = httpx.post(base + "/v1/chat/completions", json=body, headers=auth(DAVE), timeout=60)
        assert resp.status_code == 200, resp.text
        usage += resp.json()["usage"]["total_tokens"]
    assert int(time.time() // 60) == minute, "the test outlasted its minute"
    assert pool.charged(DAVE, minute) == usage and pool.reserved(DAVE) == {}


def test_text_of_four_tokens_a_character_is_reserved_as_what_it_costs(pool):
    """The review's attack: U+E0041 is one character, four bytes, four tokens. Reserved as a
    token per 4 characters, six such jobs at once were all admitted and used 2.6x the budget."""
    minute = fresh_minute(40)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "\U000e0041" * 100}], "max_tokens": 1}

    def send(_: int) -> httpx.Response:
        return httpx.post(pool.apis[0] + "/v1/chat/completions", json=body, headers=auth(ERIN), timeout=60)

    with ThreadPoolExecutor(6) as threads:
        answers = list(threads.map(send, range(6)))
    assert int(time.time() // 60) == minute, "the test outlasted its minute"
    used = [a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200]
    assert used and all(u > 400 for u in used), [a.text for a in answers]
    assert all(a.status_code == 429 for a in answers if a.status_code != 200)
    assert sum(used) <= LIMIT and pool.charged(ERIN, minute) == sum(used)


def test_what_a_job_used_beyond_its_reservation_is_charged_to_the_minute_it_ends_in(pool):
    """SETTLE on the real server: a job admitted in one minute and ended in the next is charged
    its excess there (it was charged to no minute at all)."""
    who = owner(ERIN) + "-settle"
    reserved, tokens = keys.owned(who, keys.OwnerIndex.RESERVED_TOKENS), keys.tokens_per_minute
    admit = pool.r.register_script(accounting.ADMIT)
    verdict = admit(
        keys=[reserved, reserved, reserved, reserved, tokens(who, 100), reserved],
        args=["job-a", "", 60, 0, 0, 0, 0, "0", LIMIT, 150, 50, 100],
    )
    assert verdict[0] == b"new" and pool.r.get(tokens(who, 100)) == b"150"
    settle = pool.r.register_script(accounting.SETTLE)
    assert settle(keys=[reserved, tokens(who, 101)], args=["job-a", 101, 600]) == 600
    assert pool.r.get(tokens(who, 101)) == b"450" and pool.r.get(tokens(who, 100)) == b"150"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_request_asking_for_more_than_the_whole_budget_is_told_to_ask_for_less(pool):
    body = {"model": MODEL, "messages": ASK, "max_tokens": LIMIT + 1}
    resp = httpx.post(pool.apis[0] + "/v1/chat/completions", json=body, headers=auth(CAROL), timeout=60)
    assert resp.status_code == 429 and "Lower max_tokens" in resp.json()["error"]["message"]
    assert pool.reserved(CAROL) == {}


def test_the_messages_endpoint_says_it_in_anthropic_s_headers(pool):
    fresh_minute(10)
    body = {"model": MODEL, "messages": ASK, "max_tokens": 8}
    resp = httpx.post(pool.apis[1] + "/v1/messages", json=body, headers={"x-api-key": CAROL}, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.headers["anthropic-ratelimit-tokens-limit"] == str(LIMIT)
    assert int(resp.headers["anthropic-ratelimit-tokens-remaining"]) <= LIMIT - 8
    assert resp.headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
    assert "x-ratelimit-limit-tokens" not in resp.headers
    too_big = {**body, "max_tokens": LIMIT}
    resp = httpx.post(pool.apis[1] + "/v1/messages", json=too_big, headers={"x-api-key": CAROL}, timeout=60)
    assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
    assert "anthropic-ratelimit-tokens-remaining" in resp.headers and "retry-after" in resp.headers


def test_a_job_resumed_after_its_worker_was_killed_is_charged_once(pool):
    """The last test of the module: a worker is gone after it."""
    minute = fresh_minute()
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 60,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, killed, job, last_id = [], False, None, None
    with httpx.stream(
        "POST", pool.apis[0] + "/v1/chat/completions", json=body, headers=auth(BOB), timeout=120
    ) as s:
        assert s.headers["x-ratelimit-limit-tokens"] == str(LIMIT)
        for line in s.iter_lines():
            if line.startswith("id: "):
                last_id = line[4:]
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            job = chunk["id"]
            chunks.append(chunk)
            if len(chunks) == 10 and not killed:
                holder = pool.r.hget(keys.job(job), keys.JobField.WORKER).decode()
                pool.workers[holder].signal(signal.SIGKILL)
                killed = True
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 60
    starts = [e for _, f in pool.r.xrange(keys.events(job)) if isinstance(e := entries.decode(f), Started)]
    assert len(starts) == 2  # it went on on the other worker
    # the other replica reads the end again: nothing more is charged
    resume = httpx.get(
        f"{pool.apis[1]}/v1/chat/completions/{job}?stream=true",
        headers={**auth(BOB), "Last-Event-ID": last_id or ""},
        timeout=60,
    )
    assert resume.status_code == 200 and "[DONE]" in resume.text
    assert int(time.time() // 60) == minute, "the test outlasted its minute"
    assert pool.charged(BOB, minute) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert pool.reserved(BOB) == {}
    assert pool.r.get(keys.requests_per_minute(owner(BOB), minute)) == b"1"  # one request, one job
