"""Cache-aware routing through real processes: two workers, a conversation's next turn goes
to the worker whose slot holds its history; a holder that does not take it in time, or dies,
loses it to the other worker; nothing runs twice and no text is lost.

A worker says what its slots hold before the answer's end is published (the job's own thread
writes it, worker/intake/presence.py), and its counters with its next announcement: a test
that needs those waits for them to say so, never for a time."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis

from contract import entries, keys, stats
from contract.entries import Started
from contract.jobspec import JobSpec, Message
from contract.prefixes import prefixes
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant who answers briefly. " * 30
# Each worker can keep every conversation the tests open, wherever the shared queue sends them.
SLOTS = 4
API_ENV = {
    "ROUTE_WAIT_SECONDS": "1",
    "REAPER_INTERVAL_SECONDS": "0.2",
    "REAPER_SETTLE_SECONDS": "1",
    "CANCEL_GRACE_SECONDS": "0",
}
WORKER_ENV = {"SLOTS": str(SLOTS), "HEARTBEAT_WINDOW_SECONDS": "2", "WARM_UP_SECONDS": "0"}


@dataclass
class Pool:
    base: str
    r: redis.Redis
    workers: dict[str, Proc]

    def ask(self, messages: list[dict], **extra) -> dict:
        body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
        return httpx.post(self.base + "/v1/chat/completions", json=body, timeout=120).json()

    def stream(self, messages: list[dict]) -> tuple[dict, Callable[[str], bool]]:
        """Stream an answer; returns it (as `ask` would) and whether a worker's held set
        had the conversation with that answer when the stream's end arrived."""
        body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, "stream": True}
        raw = b""
        with httpx.stream("POST", self.base + "/v1/chat/completions", json=body, timeout=120) as resp:
            for chunk in resp.iter_raw():
                raw += chunk
                if raw.rstrip().endswith(b"data: [DONE]"):
                    held = {name: self.r.smembers(keys.held_prefixes(name)) for name in self.workers}
        parsed = check_stream(raw, "chat")
        answer = {"id": parsed.chunks[0]["id"], "choices": [{"message": {"content": parsed.text}}]}
        digest = self.digest(messages, answer).encode()
        return answer, lambda name: digest in held[name]

    def digest(self, messages: list[dict], answer: dict) -> str:
        """The digest of the conversation with its answer, as the router looks it up."""
        spec = JobSpec(id="", kind="chat", model=MODEL, messages=tuple(map(Message.from_dict, messages)))
        return prefixes(spec, answer["choices"][0]["message"]["content"])[-1][0]

    def worker_of(self, job_id: str) -> str:
        return self.r.hget(keys.job(job_id), keys.JobField.WORKER).decode()

    def stats(self, field: str) -> int:
        return int(self.r.hget(keys.STATS, field) or 0)

    def wait_stat(self, field: str, at_least: int) -> None:
        deadline = time.monotonic() + 10
        while self.stats(field) < at_least:
            assert time.monotonic() < deadline, f"{field} stayed at {self.stats(field)}, under {at_least}"
            time.sleep(0.05)

    def turn(self, messages: list[dict], answer: dict, question: str) -> list[dict]:
        reply = answer["choices"][0]["message"]["content"]
        return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": question}]

    def wait_held(self, messages: list[dict], answer: dict) -> str:
        """The worker that answered, once it says it holds the conversation with that answer
        (before the answer's end since the job's thread writes it; a wait all the same)."""
        worker = self.worker_of(answer["id"])
        digest = self.digest(messages, answer)
        deadline = time.monotonic() + 10
        while not self.r.sismember(keys.held_prefixes(worker), digest):
            assert time.monotonic() < deadline, f"{worker} never said it holds {answer['id']}'s conversation"
            time.sleep(0.05)
        return worker


@pytest.fixture
def pool(tmp_path) -> Iterator[Pool]:
    yield from _pool(tmp_path, WORKER_ENV)


@pytest.fixture
def one_slot_pool(tmp_path) -> Iterator[Pool]:
    """Two workers of one slot each: a holder is full whenever it runs a job."""
    yield from _pool(tmp_path, {**WORKER_ENV, "SLOTS": "1"})


def _pool(tmp_path, worker_env: dict[str, str]) -> Iterator[Pool]:
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url, env=API_ENV)
    workers = {name: start_worker(tmp_path, url, name=name, env=worker_env) for name in ("wa", "wb")}
    try:
        wait_for_model(base, MODEL, procs=(api, *workers.values()))
        deadline = time.monotonic() + 30
        while httpx.get(base + "/v1/models").json()["data"][0]["workers"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield Pool(base, redis.Redis.from_url(url), workers)
    finally:
        for p in (*workers.values(), api, redis_proc):
            p.stop()


def conversation(i: int) -> list[dict]:
    """A conversation of its own from its first words. Conversations sharing a long system
    prompt compete for one slot's cache: a new one takes the slot of the last rather than an
    empty one (worker/engine/steps/plan.py, `choose_slot`), so a worker would hold one at a time."""
    system = {"role": "system", "content": f"Conversation {i}. {SYSTEM}"}
    return [system, {"role": "user", "content": "Name a colour and a fruit."}]


def test_each_next_turn_goes_to_the_worker_holding_its_conversation(pool):
    # Unrelated openings go to the shared queue, so to either worker; with SLOTS slots each
    # holds all it gets, and each next turn must go where its opening ran.
    opened = {}
    for i in range(SLOTS):
        messages = conversation(i)
        first = pool.ask(messages)
        opened[i] = (messages, first, pool.wait_held(messages, first))
    for i, (messages, first, holder) in opened.items():
        question = pool.turn(messages, first, "And a vegetable?")
        follow = pool.ask(question)
        assert pool.worker_of(follow["id"]) == holder, f"conversation {i}"
    assert pool.stats(stats.StatField.routed(MODEL)) >= SLOTS
    # the workers' counters come with their next announcements
    pool.wait_stat(stats.StatField.batch("routed_taken", MODEL), SLOTS)
    # each next turn read its conversation so far (over 300 tokens) from its holder's slot
    pool.wait_stat(stats.StatField.batch("cached_tokens", MODEL), SLOTS * 300 + 1)
    for name in pool.workers:
        assert pool.r.scard(keys.held_prefixes(name)) <= SLOTS * 32  # bounded: SLOTS x MAX_DIGESTS


def test_an_agent_s_next_turn_sent_the_moment_the_answer_ends_goes_to_its_holder(pool):
    # An agent reads the stream's end and sends its next turn at once: by then the holder's
    # set says it holds the conversation (the job's own thread writes it before its terminal
    # entry), not a few milliseconds later.
    _next_turns_at_once_go_to_their_holders(pool, SLOTS)


def _next_turns_at_once_go_to_their_holders(pool: Pool, conversations: int, cached: int = 0) -> None:
    """Each conversation streamed, its next turn sent the moment the answer ends: it goes to
    the worker that answered, and reads more than `cached` prompt tokens from its cache."""
    for i in range(conversations):
        messages = conversation(i)
        first, holder_knew = pool.stream(messages)
        holder = pool.worker_of(first["id"])
        assert holder_knew(holder), f"conversation {i}"
        follow = pool.ask(pool.turn(messages, first, "And a vegetable?"))
        assert pool.worker_of(follow["id"]) == holder, f"conversation {i}"
        assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] > cached, f"conversation {i}"


def test_a_next_turn_sent_at_once_finds_its_holder_s_slot_free(one_slot_pool):
    """A job that has ended is no longer counted in its worker's load, even while its thread
    publishes the end. It was counted until the next announcement (seconds), so the router
    found the holder full and the other worker free, and sent the next turn there to read
    its conversation again (issue 76: the first follow-ups after the openings, 16 s each)."""
    _next_turns_at_once_go_to_their_holders(one_slot_pool, 3, cached=300)


def test_a_conversation_written_out_of_its_slot_is_routed_to_the_worker_keeping_its_state(one_slot_pool):
    """With more conversations than slots, a worker keeps the state of a conversation its
    slot no longer holds in host memory (worker/engine/cache/), and says so: its next turn
    goes there and is restored, not read again elsewhere (issue 76)."""
    pool = one_slot_pool
    opened = []
    for i in range(4):  # on two one-slot workers: one of them at least keeps two
        messages = conversation(i)
        first = pool.ask(messages)
        opened.append((messages, first, pool.wait_held(messages, first)))
    for i, (messages, first, holder) in enumerate(opened):  # still said, slot or host memory
        assert pool.r.sismember(keys.held_prefixes(holder), pool.digest(messages, first)), f"conversation {i}"
    restored = pool.stats(stats.StatField.batch("host_hits", MODEL))
    for i, (messages, first, holder) in enumerate(opened):
        follow = pool.ask(pool.turn(messages, first, "And a vegetable?"))
        assert pool.worker_of(follow["id"]) == holder, f"conversation {i}"
        assert follow["usage"]["prompt_tokens_details"]["cached_tokens"] > 300, f"conversation {i}"
    pool.wait_stat(stats.StatField.batch("host_hits", MODEL), restored + 1)


def test_a_holder_that_does_not_take_the_job_in_time_loses_it_to_the_other_worker(pool):
    messages = conversation(0)
    first = pool.ask(messages)
    holder = pool.wait_held(messages, first)  # stopped before that, it would never say so
    pool.workers[holder].signal(signal.SIGSTOP)  # alive (its connections stay) but taking nothing
    try:
        sent = time.time()
        follow = pool.ask(pool.turn(messages, first, "And a vegetable?"))
    finally:
        pool.workers[holder].signal(signal.SIGCONT)
    assert pool.worker_of(follow["id"]) != holder
    # started elsewhere after its deadline (1 s) and the reaper's tick, not when the holder
    # came back (the answer's own length, which load stretches, is not counted)
    stream = pool.r.xrange(keys.events(follow["id"]))
    started = next(int(i.split(b"-")[0]) / 1000 for i, f in stream if isinstance(entries.decode(f), Started))
    assert started - sent < 15
    assert pool.stats(stats.StatField.route_fallbacks(MODEL)) == 1


def test_a_dead_holder_s_prefixes_go_with_it_and_its_conversation_goes_on_elsewhere(pool):
    messages = conversation(1)
    first = pool.ask(messages)
    holder = pool.wait_held(messages, first)
    pool.workers[holder].signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pool.r.exists(keys.held_prefixes(holder)):  # its connection is gone: at once
        assert time.monotonic() < deadline
        time.sleep(0.1)
    follow = pool.ask(pool.turn(messages, first, "And a vegetable?"))
    assert pool.worker_of(follow["id"]) != holder and follow["choices"][0]["finish_reason"]


def test_a_holder_that_dies_with_the_routed_job_leaves_it_whole_and_run_once(pool):
    messages = conversation(2)
    first = pool.ask(messages)
    holder = pool.wait_held(messages, first)  # so the next turn is routed there
    body = {
        "model": MODEL,
        "messages": pool.turn(messages, first, "Now tell a long story about them."),
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    raw = b""
    with httpx.stream("POST", pool.base + "/v1/chat/completions", json=body, timeout=120) as resp:
        for chunk in resp.iter_raw():
            raw += chunk
            if raw.count(b'"content":"') == 10 and pool.workers[holder].alive():
                pool.workers[holder].signal(signal.SIGKILL)  # mid-stream, on the routed job
    parsed = check_stream(raw, "chat", include_usage=True)
    job_id = parsed.chunks[0]["id"]
    events = [entries.decode(f) for _, f in pool.r.xrange(keys.events(job_id))]
    starts = [e for e in events if isinstance(e, Started)]
    assert starts[0].worker == holder and starts[-1].worker != holder  # routed, then resumed
    assert parsed.error is None and parsed.usage["completion_tokens"] == 200
    replay = httpx.get(f"{pool.base}/v1/chat/completions/{job_id}?stream=true", timeout=60).content
    assert check_stream(replay, "chat", include_usage=True).text == parsed.text  # nothing lost or doubled
