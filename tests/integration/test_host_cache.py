"""The host tier of the prompt cache through real processes (worker/engine/cache/): a
conversation written out of every slot comes back from host memory, for its own key only, with
the greedy answer of a run that read it whole; the tier's bound holds the worker's memory; a
restore beside a running stream leaves that stream's tokens as they were alone."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

ALICE, BOB, OPERATOR = "sk-alice-0123456789", "sk-bob-0123456789", "sk-operator-0123456789"
PREFIX_TOKENS = 300  # each conversation's system prompt is longer than this
MIB = 1 << 20
# a system prompt the operator made public (PUBLIC_PROMPTS_FILE): shared in the slots by every key
PUBLIC = "You are the public help desk of Example Corp; answer in one short sentence. " * 25


def system(n: int) -> str:
    """Conversation n's own system prompt (~400 tokens, no two alike from the first words)."""
    return f"Conversation {n}: you are assistant number {n}. " + f"Answer briefly, as helper {n} would. " * 40


@dataclass
class Stack:
    base: str
    worker: Proc

    def ask(self, messages: list[dict], key: str = ALICE, max_tokens: int = 8) -> dict:
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        resp = httpx.post(
            self.base + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=180,
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    def opening(self, n: int, key: str = ALICE) -> tuple[list[dict], dict]:
        messages = [{"role": "system", "content": system(n)}, {"role": "user", "content": "Name a colour."}]
        return messages, self.ask(messages, key)

    def metric(self, name: str) -> float:
        """A /metrics family, summed over its labels, as the operator reads it."""
        resp = httpx.get(self.base + "/metrics", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert resp.status_code == 200, resp.text
        lines = [line for line in resp.text.splitlines() if line.startswith(name + "{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    def counted(self, name: str, at_least: float) -> float:
        """A batch counter once the worker announced it (every second or so)."""
        deadline = time.monotonic() + 10
        while (value := self.metric(name)) < at_least and time.monotonic() < deadline:
            time.sleep(0.2)
        return value


def then(messages: list[dict], answer: dict, question: str) -> list[dict]:
    """The next turn: the answer put back in the history, as an agent does."""
    reply = {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
    return [*messages, reply, {"role": "user", "content": question}]


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_stack(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[Stack]:
    redis_proc, url = start_redis(tmp_path)
    public = tmp_path / "public-prompts.json"
    public.write_text(json.dumps([PUBLIC]))
    env = {"API_KEYS": f"{ALICE},{BOB}", "OPERATOR_KEYS": OPERATOR, "PUBLIC_PROMPTS_FILE": str(public)}
    api, base = start_api(tmp_path, url, env=env)
    # Prompts read 64 tokens a step, as a stream's neighbours are: this tiny model's greedy
    # answers to these prompts are near ties, which a reading in other step sizes can flip
    # (llama.cpp's sums are not batch-invariant), and the tests compare answers across paths.
    worker = start_worker(tmp_path, url, env={"WARM_UP_SECONDS": "0", "PREFILL_ALONE": "64", **worker_env})
    try:
        wait_for_model(base, MODEL, procs=(api, worker), headers={"Authorization": f"Bearer {ALICE}"})
        yield Stack(base, worker)
    finally:
        for p in (worker, api, redis_proc):
            p.stop()


@pytest.fixture
def stack(tmp_path) -> Iterator[Stack]:
    """One worker of two slots, its tier bounded well above what the tests keep."""
    yield from open_stack(tmp_path, {"SLOTS": "2", "HOST_CACHE_MIB": "128"})


def test_a_conversation_out_of_every_slot_comes_back_from_host_memory_for_its_key_only(stack):
    messages, first = stack.opening(0)
    assert cached(first) == 0
    for n in (1, 2):  # two more conversations: on two slots the first is written out
        stack.opening(n)
    follow_up = then(messages, first, "And another one?")
    again = stack.ask(follow_up)
    # its system prompt, question and answer came back from host memory, not read again
    assert cached(again) >= first["usage"]["prompt_tokens"] - 4 > PREFIX_TOKENS
    assert stack.counted("tokenspool_batch_host_hits_total", 1) >= 1
    assert stack.metric("tokenspool_batch_host_restored_tokens_total") >= cached(again)
    assert stack.metric("tokenspool_worker_host_cache_bytes") > 0
    for n in (3, 4):  # out of the slots again: only host memory holds Alice's conversation
        stack.opening(n)
    hits = stack.counted("tokenspool_batch_host_hits_total", 1)
    # Bob sends her very prompt: her kept state is not his, he reads it all
    bob = stack.ask(follow_up, key=BOB)
    assert cached(bob) == 0 and bob["usage"]["prompt_tokens"] == again["usage"]["prompt_tokens"]
    # and his answer, read from nothing, is the one hers gave from the restored state
    assert text(bob) == text(again)
    time.sleep(1.5)  # an announcement later
    assert stack.metric("tokenspool_batch_host_hits_total") == hits


def test_a_public_prompt_s_head_is_never_shared_through_the_tier(stack):
    conversation = [{"role": "system", "content": PUBLIC}, {"role": "user", "content": "Name a colour."}]
    stack.ask(conversation)
    for n in (1, 2):  # both slots taken by other conversations: host memory alone holds it
        stack.opening(n)
    assert stack.counted("tokenspool_batch_host_saved_total", 1) >= 1
    # in a slot the public prompt would be every key's (tests/integration/test_tenancy.py);
    # Alice's kept state is hers alone
    assert cached(stack.ask(conversation, key=BOB)) == 0
    assert cached(stack.ask(conversation)) > PREFIX_TOKENS  # her own state comes back


def test_a_restore_beside_a_running_stream_leaves_its_tokens_as_alone(stack):
    long_story = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]
    alone = stack.ask(long_story, max_tokens=48)
    messages, first = stack.opening(0)
    for n in (1, 2):
        stack.opening(n)
    follow_up = then(messages, first, "And another one?")
    hits = stack.counted("tokenspool_batch_host_hits_total", 1)
    got: dict = {}
    stream = threading.Thread(target=lambda: got.update(stack.ask(long_story, max_tokens=48)))
    stream.start()
    time.sleep(0.3)  # it reads its prompt and decodes: the restore comes into the other slot
    restored = stack.ask(follow_up)
    stream.join()
    assert cached(restored) > PREFIX_TOKENS
    assert stack.counted("tokenspool_batch_host_hits_total", hits + 1) >= hits + 1
    assert text(got) == text(alone)
    assert got["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]


def test_the_tier_s_bound_holds_the_worker_s_memory_under_a_flood_of_prompts(tmp_path):
    bound = 24
    for stack in open_stack(tmp_path, {"SLOTS": "1", "N_CTX": "1024", "HOST_CACHE_MIB": str(bound)}):
        stack.opening(1000, key=BOB)  # the pages a prompt of this size uses, touched; nothing kept
        assert stack.metric("tokenspool_worker_host_cache_bytes") == 0
        before = rss(stack.worker.pid)
        for n in range(20):  # ~9 MiB a state: 180 MiB kept without a bound
            stack.opening(n)
        grown = rss(stack.worker.pid) - before
        assert stack.counted("tokenspool_batch_host_evictions_total", 1) >= 1
        assert 0 < stack.metric("tokenspool_worker_host_cache_bytes") <= bound * MIB
        assert grown <= bound * MIB * 1.1, f"grew {grown / MIB:.1f} MiB past a {bound} MiB tier"
