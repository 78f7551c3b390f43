"""Tenants through real processes: each API key reads and fills only its own prompt cache
(a worker's slots and the router's digests alike), unless keys share a `cache_salt` on purpose
(contract/prefixes.py `cache_scope`); the usage says what the cache held.

The cache tests run one worker with two slots: whichever key asks, its job lands on the
worker whose slot holds the other key's prompt, so a hit across keys cannot hide behind
placement. Routing needs two workers (with one there is nothing to choose)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import redis

from api.http.auth import digest
from contract import entries, keys, stats
from contract.entries import Started
from contract.jobspec import JobSpec, Message
from contract.prefixes import cache_scope, prefixes
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.hold import holding
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

ALICE, BOB, CAROL = "sk-alice-0123456789", "sk-bob-0123456789", "sk-carol-0123456789"
OPERATOR = "sk-operator-0123456789"
SALT = "a shared secret salt, long and random: 5f0c9d2e8a7b4c1d"
SYSTEM = "You are a careful assistant who answers briefly and never repeats the question. " * 25
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
PROMPT_TOKENS = 300  # the prompt above is longer: a hit reads back at least this much
# a system prompt the operator made public (PUBLIC_PROMPTS_FILE)
PUBLIC = "You are the public help desk of Example Corp; answer in one short sentence. " * 25


def owner(key: str) -> str:
    return digest(key)[:32]  # api/http/auth.py: a job's owner is a prefix of its key's SHA-256


@dataclass
class Stack:
    base: str
    r: redis.Redis
    workers: dict[str, Proc]

    def ask(self, key: str, **extra) -> dict:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, **extra}
        headers = {"Authorization": f"Bearer {key}"}
        resp = httpx.post(self.base + "/v1/chat/completions", json=body, headers=headers, timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def send(self, key: str, messages: list[dict]) -> str:
        """A background job; its id."""
        body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, "background": True}
        headers = {"Authorization": f"Bearer {key}"}
        resp = httpx.post(self.base + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    def status(self, job_id: str) -> str:
        return (self.r.hget(keys.job(job_id), keys.JobField.STATUS) or b"").decode()

    def started_ms(self, job_id: str) -> int:
        """When its (first) attempt started: its Started entry's stream id."""
        rows = self.r.xrange(keys.events(job_id))
        return next(int(i.split(b"-")[0]) for i, f in rows if isinstance(entries.decode(f), Started))

    def metric(self, name: str) -> float:
        """A counter of /metrics, summed over its labels, as the operator reads it."""
        resp = httpx.get(self.base + "/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert resp.status_code == 200, resp.text
        return sum(float(line.rsplit(" ", 1)[1]) for line in resp.text.splitlines() if line.startswith(name))

    def in_use(self, worker: str) -> int:
        """Its slots in use, as it last announced them (worker/intake/presence.py)."""
        return int(self.r.hget(keys.worker_load(MODEL), worker).split()[0])

    def routed(self) -> int:
        return int(self.r.hget(keys.STATS, stats.StatField.routed(MODEL)) or 0)

    def fallbacks(self) -> int:
        return int(self.r.hget(keys.STATS, stats.StatField.route_fallbacks(MODEL)) or 0)

    def wait_held(self, answer: dict, scope: str) -> None:
        """Until the worker that answered says its slot holds this conversation with its
        answer, in `scope`: what routing a next request of that scope relies on."""
        worker = self.r.hget(keys.job(answer["id"]), keys.JobField.WORKER).decode()
        messages = tuple(map(Message.from_dict, MESSAGES))
        spec = JobSpec(id="", kind="chat", model=MODEL, messages=messages, cache_scope=scope)
        held = prefixes(spec, answer["choices"][0]["message"]["content"])[-1][0]
        deadline = time.monotonic() + 10
        while not self.r.sismember(keys.held_prefixes(worker), held):
            assert time.monotonic() < deadline, f"{worker} never said it holds {answer['id']}"
            time.sleep(0.05)


def wait_for(ready: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.05)


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.fixture
def stack(tmp_path, request) -> Iterator[Stack]:
    """An API taking three keys, and `request.param` workers of two slots each, or given
    (workers, slots, ROUTE_WAIT_SECONDS), of those."""
    workers, slots, route_wait = request.param if isinstance(request.param, tuple) else (request.param, 2, 5)
    redis_proc, url = start_redis(tmp_path)
    public = tmp_path / "public-prompts.json"
    public.write_text(json.dumps([PUBLIC]))
    env = {
        "PUBLIC_PROMPTS_FILE": str(public),
        "API_KEYS": ",".join((ALICE, BOB, CAROL)),
        "OPERATOR_KEYS": OPERATOR,
        "ROUTE_WAIT_SECONDS": str(route_wait),
    }
    api, base = start_api(tmp_path, url, env=env | {"REAPER_INTERVAL_SECONDS": "0.2"})
    names = [f"w{i}" for i in range(workers)]
    worker_env = {"SLOTS": str(slots), "WARM_UP_SECONDS": "0"}
    procs = [start_worker(tmp_path, url, name=n, env=worker_env) for n in names]
    try:
        auth = {"Authorization": f"Bearer {ALICE}"}
        wait_for_model(base, MODEL, procs=(api, *procs), headers=auth)
        deadline = time.monotonic() + 30
        while httpx.get(base + "/v1/models", headers=auth).json()["data"][0]["workers"] < len(names):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield Stack(base, redis.Redis.from_url(url), dict(zip(names, procs, strict=True)))
    finally:
        for p in (*procs, api, redis_proc):
            p.stop()


@pytest.mark.parametrize("stack", [1], indirect=True, ids=["one worker"])
def test_a_key_hits_its_own_prompt_cache_and_no_other_key_s(stack):
    first = stack.ask(ALICE)
    assert cached(first) == 0

    # Bob sends the very same prompt: the worker, holding Alice's prompt in a slot, reads
    # all of Bob's again
    bob = stack.ask(BOB)
    assert cached(bob) == 0 and bob["usage"]["prompt_tokens"] > PROMPT_TOKENS

    # Alice again: her slot's cache is read, not the prompt
    again = stack.ask(ALICE)
    assert cached(again) > PROMPT_TOKENS
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]

    # through the SDK, and on the Responses endpoint, the same figure
    sdk = openai.OpenAI(base_url=stack.base + "/v1", api_key=ALICE, max_retries=0)
    chat = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens > PROMPT_TOKENS
    response = sdk.responses.create(
        model=MODEL, instructions=SYSTEM, input="Name a colour.", max_output_tokens=8, temperature=0
    )
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens > PROMPT_TOKENS


@pytest.mark.parametrize("stack", [1], indirect=True, ids=["one worker"])
def test_a_public_system_prompt_s_cache_is_every_key_s_and_the_rest_of_a_prompt_is_not(stack):
    conversation = [{"role": "system", "content": PUBLIC}, {"role": "user", "content": "Name a colour."}]
    first = stack.ask(ALICE, messages=conversation)
    assert cached(first) == 0
    # Bob sends the very same conversation: the worker reads back the public prompt only
    bob = stack.ask(BOB, messages=conversation)
    assert cached(bob) > PROMPT_TOKENS
    assert bob["usage"]["prompt_tokens"] - cached(bob) >= 5  # his own question, read again
    # Bob's job took the slot that held Alice's conversation (it shared the most): Carol (her
    # salt's scope, which keeps nothing in host memory) reads back the public prompt only,
    # though Bob's question there is the same as hers
    carol = stack.ask(CAROL, messages=conversation, cache_salt=SALT)
    assert cached(carol) == cached(bob)
    # Alice's own conversation, written out of the slot, comes back from host memory
    # (worker/engine/cache/): all of it, not Bob's copy of the public part
    again = stack.ask(ALICE, messages=conversation)
    assert cached(again) == again["usage"]["prompt_tokens"] - 1 > cached(bob)
    assert cached(stack.ask(CAROL)) == 0  # a prompt nobody made public stays private


def tool(name: str, description: str) -> dict:
    parameters = {"type": "object", "properties": {"since": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


@pytest.mark.parametrize("stack", [(1, 1, 5)], indirect=True, ids=["one worker of one slot"])
def test_a_public_prompt_shares_its_own_text_and_never_the_tools_sent_with_it(stack):
    # one slot: each job finds the one before it in the cache. Alice sends the public prompt
    # with tools of her own; Bob guesses them, right then wrong, each time after her.
    secret = [tool("crm_export_all_customers", "Export every customer's record, as CSV.")]
    wrong = [tool("crm_delete_customer", "Delete one customer's record.")]
    public = [{"role": "system", "content": PUBLIC}]
    conversation = [*public, {"role": "user", "content": "Export the customers."}]
    alone = stack.ask(CAROL, messages=public)["usage"]["prompt_tokens"]  # the public message alone

    def guess(tools: list[dict], salt: str) -> int:
        """Bob's guess, in a scope of its own (a salt): his earlier guess, kept in host memory
        (worker/engine/cache/), is not read back in the next."""
        stack.ask(ALICE, messages=conversation, tools=secret)
        return cached(stack.ask(BOB, messages=conversation, tools=tools, cache_salt=salt))

    right, wrong_guess = guess(secret, SALT + "-right"), guess(wrong, SALT + "-wrong")
    assert right == wrong_guess, "a right guess of Alice's tools read back more of her cache"
    assert PROMPT_TOKENS < right <= alone  # the public text is still shared, and no more


@pytest.mark.parametrize("stack", [1], indirect=True, ids=["one worker"])
def test_keys_sharing_a_cache_salt_share_one_cache(stack):
    assert cached(stack.ask(BOB, cache_salt=SALT)) == 0
    assert cached(stack.ask(ALICE)) == 0  # without the salt: her own cache, empty
    assert cached(stack.ask(CAROL, cache_salt=SALT)) > PROMPT_TOKENS  # Bob's slot, read back


@pytest.mark.parametrize("stack", [2], indirect=True, ids=["two workers"])
def test_routing_follows_only_a_key_s_own_prompts_or_its_salt_s(stack):
    first = stack.ask(ALICE)
    stack.wait_held(first, cache_scope(owner(ALICE)))
    routed = stack.routed()
    seen = stack.metric("tokenspool_routed_jobs_total")
    stack.ask(BOB)  # Bob guesses Alice's prompt right: the oracle of issue 52 says nothing
    assert stack.routed() == routed, "Bob's job was routed by Alice's prompt"
    assert stack.metric("tokenspool_routed_jobs_total") == seen
    for path in ("/metrics", f"/scaling/{MODEL}"):  # and a tenant never reads the pool's counters
        refused = httpx.get(stack.base + path, headers={"Authorization": f"Bearer {BOB}"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_only"
    stack.ask(ALICE)
    assert stack.routed() == routed + 1  # her own prompt: to the worker holding it

    salted = stack.ask(BOB, cache_salt=SALT)
    stack.wait_held(salted, cache_scope(owner(BOB), SALT))
    carol = stack.ask(CAROL, cache_salt=SALT)
    assert stack.routed() == routed + 2 and cached(carol) > PROMPT_TOKENS


@pytest.mark.parametrize("stack", [(2, 1, 1)], indirect=True, ids=["two workers of one slot"])
def test_a_routed_job_that_falls_back_waits_behind_other_keys_earlier_jobs(stack):
    # Bob plants his prompt on a worker, which then stops (alive, taking nothing: a slot
    # given to another job would drop his prompt, and routing with it); Carol holds the
    # other worker; Alice queues two jobs, then Bob's same prompt is routed to its holder,
    # misses its deadline and falls back.
    bobs = stack.ask(BOB)
    stack.wait_held(bobs, cache_scope(owner(BOB)))
    name = stack.r.hget(keys.job(bobs["id"]), keys.JobField.WORKER).decode()
    # routing skips a worker that says all its slots are taken: wait until it says so no more
    wait_for(lambda: stack.in_use(name) == 0, f"{name} to announce its slot free")
    holder = stack.workers[name]
    carol = {"Authorization": f"Bearer {CAROL}"}
    holder.signal(signal.SIGSTOP)
    try:
        with holding(stack.base, MODEL, carol) as held:
            wait_for(lambda: stack.status(held) == "running", "the other worker to be busy")
            alice = [stack.send(ALICE, [{"role": "user", "content": f"Say {w}."}]) for w in ("yes", "no")]
            bob = stack.send(BOB, MESSAGES)
            assert stack.routed() == 1  # Alice's short prompts are not routed; Bob's is
            wait_for(lambda: stack.fallbacks() == 1, "Bob's job to fall back")
            holder.signal(signal.SIGCONT)
    finally:
        holder.signal(signal.SIGCONT)
    # the workers free up: the shared queue's order is what they take
    for job_id in (*alice, bob):
        wait_for(lambda job_id=job_id: stack.status(job_id) == "done", f"{job_id} to end")
    started = {job_id: stack.started_ms(job_id) for job_id in (*alice, bob)}
    assert started[bob] >= max(started[a] for a in alice), started
