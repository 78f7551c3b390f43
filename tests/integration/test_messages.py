"""Anthropic's Messages API through real processes and the official `anthropic` SDK (validating
every object and event against its own types): text, tools, thinking, counts, a request shaped
like Claude Code's, Anthropic's errors with nothing enqueued, a resume by Last-Event-ID, and a
worker killed in the middle of a tool call's arguments."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import pytest
import redis

from contract import keys
from devstack.peek import job_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.integration.conftest import MODEL
from tests.integration.test_resume import refused_at_once
from tests.js_clients import run_node

pytestmark = pytest.mark.integration

KEY = "sk-messages-test"
TEMPLATE = str(Path(__file__).resolve().parent.parent / "data" / "thinking-chatml.jinja")
THINKING = "smollm2-thinking"
GREEDY = {"temperature": 0}
CLAMPED = 40  # the SDK no longer names sampling parameters; the API takes them
ASK = [{"role": "user", "content": "Tell me about foxes."}]
STORY_TOOL = {
    "name": "save_story",
    "description": "Save a short story.",
    "input_schema": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "story": {"type": "string", "minLength": 120, "maxLength": 240},
        },
        "required": ["title", "story"],
    },
}


@dataclass
class Pool:
    base: str
    r: redis.Redis
    workers: dict[str, Proc]
    clamped: str  # an API of the same pool whose MAX_TOKENS_LIMIT is CLAMPED

    def sdk(self, base: str | None = None) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=base or self.base,
            api_key=KEY,
            max_retries=0,
            timeout=120,
            _strict_response_validation=True,
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120, headers={"x-api-key": KEY})

    def holder(self, job_id: str) -> Proc:
        return self.workers[self.r.hget(keys.job(job_id), keys.JobField.WORKER).decode()]


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    """Two workers of the default model (a killed one's job goes on on the other), one of the
    same weights behind a thinking template, and one API that needs a key (and another whose
    MAX_TOKENS_LIMIT is CLAMPED, to see Claude Code's max_tokens clamped to it)."""
    logs = tmp_path_factory.mktemp("messages")
    redis_proc, url = start_redis(logs)
    api, base = start_api(
        logs, url, env={"API_KEYS": KEY, "KEEPALIVE_SECONDS": "0.5", "REAPER_INTERVAL_SECONDS": "0.2"}
    )
    clamped, clamped_base = start_api(
        logs, url, name="api-clamped", env={"API_KEYS": KEY, "MAX_TOKENS_LIMIT": str(CLAMPED)}
    )
    env = {"SLOTS": "2", "HEARTBEAT_WINDOW_SECONDS": "2"}
    thinking = {"CHAT_TEMPLATE_FILE": TEMPLATE, "MODEL_NAME": THINKING, "SLOTS": "1"}
    workers = {
        "m1": start_worker(logs, url, name="m1", env=env),
        "m2": start_worker(logs, url, name="m2", env=env),
        "t1": start_worker(logs, url, name="t1", env=thinking),
    }
    try:
        for model in (MODEL, THINKING):
            wait_for_model(base, model, procs=(api, *workers.values()), headers={"x-api-key": KEY})
        yield Pool(base, redis.Redis.from_url(url), workers, clamped_base)
    finally:
        for p in (*workers.values(), api, clamped, redis_proc):
            p.stop()


def sse(lines: Iterator[str]) -> Iterator[tuple[str | None, str, dict]]:
    """(id, event, data) of each event of an Anthropic stream but its keep-alives (pings,
    which carry no id: a resume from the last id misses nothing)."""
    eid, kind = None, ""
    for line in lines:
        if line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            if kind == "ping":
                assert eid is None and data == {"type": "ping"}
            else:
                yield eid, kind, data
            eid = None


def test_a_message_created_and_streamed_are_the_same_and_counted_exactly(pool):
    sdk = pool.sdk()
    done = sdk.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    assert done.id.startswith("msg_") and done.role == "assistant" and done.model == MODEL
    assert [b.type for b in done.content] == ["text"] and done.stop_reason in ("max_tokens", "end_turn")
    with sdk.messages.stream(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == done.content[0].text == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == done.stop_reason and final.usage.output_tokens == done.usage.output_tokens
    counted = sdk.messages.count_tokens(model=MODEL, messages=ASK)
    prompt = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == prompt > 5

    with (
        pool.http() as http,
        http.stream(
            "POST",
            "/v1/messages",
            json={**GREEDY, "model": MODEL, "max_tokens": 8, "messages": ASK, "stream": True},
        ) as resp,
    ):
        events = list(sse(resp.iter_lines()))
    kinds = [kind for _, kind, _ in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(kinds[2:-3]) == {"content_block_delta"} and all(d["type"] == k for _, k, d in events)
    assert [int(eid) for eid, _, _ in events] == list(range(len(events)))  # numbered, for a resume


def test_a_stop_sequence_is_named_when_it_ends_the_message(pool):
    sdk = pool.sdk()
    text = sdk.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY).content[0].text  # type: ignore[union-attr]
    word = text.split()[3]
    done = sdk.messages.create(
        model=MODEL, max_tokens=24, messages=ASK, stop_sequences=["zzz", word], extra_body=GREEDY
    )
    assert done.stop_reason == "stop_sequence" and done.stop_sequence == word
    assert text.startswith(done.content[0].text) and word not in done.content[0].text  # type: ignore[union-attr]


def test_a_tool_round_trip(pool):
    sdk = pool.sdk()
    ask = [{"role": "user", "content": "Write and save a story about a fox."}]
    kwargs = {"model": MODEL, "max_tokens": 300, "tools": [STORY_TOOL], "extra_body": GREEDY}
    one = {"type": "any", "disable_parallel_tool_use": True}
    done = sdk.messages.create(**kwargs, messages=ask, tool_choice=one)
    assert done.stop_reason == "tool_use" and [b.type for b in done.content] == ["tool_use"]
    call = done.content[0]
    assert call.name == "save_story" and len(call.input["story"]) >= 120  # type: ignore[union-attr,index]
    with sdk.messages.stream(**kwargs, messages=ask, tool_choice=one) as stream:
        parts = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use"
    # A prompt read cold and one read from the cache may part at a near tie (docs/benchmarks.md,
    # the host tier's section), and either of the two workers may take a request: the stream's
    # call is compared with an answer that took as many tokens from the cache as it did.
    cached = final.usage.cache_read_input_tokens
    alike = done
    for _ in range(3):
        if alike.usage.cache_read_input_tokens == cached:
            break
        alike = sdk.messages.create(**kwargs, messages=ask, tool_choice=one)
    assert alike.usage.cache_read_input_tokens == cached
    assert len(parts) > 10 and json.loads("".join(parts)) == final.content[0].input == alike.content[0].input  # type: ignore[union-attr]

    turn = [
        *ask,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in done.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Saved."}]},
    ]
    answer = sdk.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[STORY_TOOL],
        messages=turn,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("max_tokens", "end_turn")


def tool_rounds(n: int) -> list[dict]:
    """A conversation of `n` tool_use/tool_result rounds, each result a long listing."""
    turns: list[dict] = [{"role": "user", "content": "Read the five files and sum up."}]
    for i in range(n):
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"path": f"file{i}.txt"}}
        listing = " ".join(f"line {k}: the fox number {k} jumped over the lazy dog." for k in range(20))
        turns += [
            {"role": "assistant", "content": [call]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": listing}],
            },
        ]
    return turns


READ_TOOL = {"name": "read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}


def test_clear_tool_uses_clears_the_old_tool_results_past_its_trigger(pool):
    """Five rounds, a trigger below their size and keep 1: four results cleared, the prompt
    smaller than without the edit, said in the Message and in its stream's message_delta."""
    sdk = pool.sdk()
    kwargs = {
        "model": MODEL,
        "max_tokens": 8,
        "tools": [READ_TOOL],
        "messages": tool_rounds(5),
        "extra_body": GREEDY,
    }
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 500},
        "keep": {"type": "tool_uses", "value": 1},
    }
    whole = sdk.beta.messages.create(**kwargs)
    cleared = sdk.beta.messages.create(
        **kwargs, context_management={"edits": [edit]}, betas=["context-management-2025-06-27"]
    )
    assert whole.context_management is None and cleared.context_management is not None
    (applied,) = cleared.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 4
    prompt = lambda m: m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)  # noqa: E731
    assert prompt(cleared) == prompt(whole) - applied.cleared_input_tokens < prompt(whole)
    with sdk.beta.messages.stream(**kwargs, context_management={"edits": [edit]}) as stream:
        deltas = [e for e in stream if e.type == "message_delta"]
        final = stream.get_final_message()
    assert [e.context_management.applied_edits for e in deltas] == [[applied]]  # type: ignore[union-attr]
    assert final.context_management is not None and final.context_management.applied_edits == [applied]
    assert prompt(final) == prompt(cleared)
    counted = sdk.beta.messages.count_tokens(
        model=MODEL, tools=[READ_TOOL], messages=tool_rounds(5), context_management={"edits": [edit]}
    )
    assert counted.input_tokens == prompt(cleared)
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == prompt(whole)
    untouched = {**edit, "trigger": {"type": "input_tokens", "value": prompt(whole)}}  # not past it
    same = sdk.beta.messages.create(**kwargs, context_management={"edits": [untouched]})
    assert same.context_management is None and prompt(same) == prompt(whole)


def test_thinking_streams_as_signed_thinking_blocks_and_comes_back_accepted(pool):
    sdk = pool.sdk()
    ask = [{"role": "user", "content": "Is 17 a prime number?"}]
    with sdk.messages.stream(model=THINKING, max_tokens=24, messages=ask, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking and len(thinking.signature) == 64
    deltas = [e.delta for e in events if e.type == "content_block_delta" and e.index == 0]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == thinking.thinking
    assert deltas[-1].type == "signature_delta" and deltas[-1].signature == thinking.signature
    assert final.usage.output_tokens_details is not None
    assert 0 < final.usage.output_tokens_details.thinking_tokens <= final.usage.output_tokens

    omitted = sdk.messages.create(
        model=THINKING,
        max_tokens=24,
        messages=ask,
        thinking={"type": "adaptive", "display": "omitted"},
        extra_body=GREEDY,
    )
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""
    assert omitted.content[0].signature == thinking.signature  # the same thought, not shown

    off = sdk.messages.create(
        model=THINKING, max_tokens=16, messages=ask, thinking={"type": "disabled"}, extra_body=GREEDY
    )
    assert [b.type for b in off.content] == ["text"]
    second = [
        *ask,
        {
            "role": "assistant",
            "content": [
                thinking.model_dump(),
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Yes."},
            ],
        },
        {"role": "user", "content": "And 21?"},
    ]
    again = sdk.messages.create(
        model=THINKING,
        max_tokens=8,
        messages=second,
        thinking={"type": "adaptive"},
        extra_body=GREEDY,
    )
    assert again.content and again.usage.output_tokens == 8


def test_a_thinking_budget_ends_the_thinking_and_the_answer_follows(pool):
    """SmolLM2 never closes the block its template opens: the worker closes it at the budget."""
    done = pool.sdk().messages.create(
        model=THINKING,
        max_tokens=24,
        messages=[{"role": "user", "content": "Is 17 a prime number?"}],
        thinking={"type": "enabled", "budget_tokens": 6},
        extra_body=GREEDY,
    )
    assert [b.type for b in done.content] == ["thinking", "text"], (done.stop_reason, done.usage)
    details = done.usage.output_tokens_details
    assert details is not None and 6 < details.thinking_tokens < 6 + 10 < done.usage.output_tokens
    assert done.content[0].thinking and done.content[1].text  # type: ignore[union-attr]


def _claude_code_tools(n: int) -> list[dict]:
    """Tools as Claude Code declares its own: zod's JSON schemas ($schema, additionalProperties,
    a URL's format, a number's bound), cache_control on the last."""
    tools = []
    for i in range(n):
        tools.append(
            {
                "name": f"Tool{i}",
                "description": f"Tool number {i}. " * 4,
                "input_schema": {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "url": {"type": "string", "format": "uri", "description": "The URL"},
                        "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 600000},
                        "mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                        "pattern": {"type": "string", "pattern": "^[a-z]+$"},
                        "todos": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "content": {"type": "string", "minLength": 1},
                                    "status": {
                                        "type": "string",
                                        "enum": ["pending", "in_progress", "completed"],
                                    },
                                },
                                "required": ["content", "status"],
                                "additionalProperties": False,
                            },
                        },
                    },
                    "required": ["url"],
                },
            }
        )
    tools[-1]["cache_control"] = {"type": "ephemeral"}
    return tools


def test_a_request_shaped_like_claude_codes(pool):
    body = {
        "model": MODEL,
        "max_tokens": 12,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_account__session_0f8e"},
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                    {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}},
                ],
            }
        ],
        "tools": _claude_code_tools(12),
    }
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    with pool.http() as http:
        with http.stream("POST", "/v1/messages?beta=true", json=body, headers=headers) as resp:
            assert resp.status_code == 200, resp.read()
            events = list(sse(resp.iter_lines()))
        kinds = [kind for _, kind, _ in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", events[-1]
        count = http.post(
            "/v1/messages/count_tokens?beta=true",
            json={k: v for k, v in body.items() if k in ("model", "system", "messages", "tools")},
            headers=headers,
        )
        assert count.status_code == 200 and count.json()["input_tokens"] > 12 * 40
        for auth in ({}, {"x-api-key": "wrong"}):
            refused = httpx.post(pool.base + "/v1/messages", json=body, headers=auth)
            assert refused.status_code == 401
            assert refused.json() == {
                "type": "error",
                "error": {"type": "authentication_error", "message": refused.json()["error"]["message"]},
            }
        bearer = httpx.post(
            pool.base + "/v1/messages/count_tokens",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": MODEL, "messages": ASK},
        )
        assert bearer.status_code == 200


BAD = [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video", "data": "x"}]}]}, "type"),
    (
        {
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_none", "content": "x"}],
                }
            ],
        },
        "tool_result",
    ),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": "x"}, *ASK]}, "first message"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "tool", "content": "x"}]}, "role"),
    (
        {
            "max_tokens": 8,
            "messages": ASK,
            "context_management": {
                "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 1}}]
            },
        },
        "context_management.edits[0].keep.type",
    ),
    (
        {
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        }
                    ],
                }
            ],
        },
        "PNG, JPEG, WebP or GIF",
    ),
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "budget"),
    (
        {"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "search"}]},
        "tools",
    ),
    ({"max_tokens": 8, "messages": ASK, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 8, "messages": ASK, "top_k": "5"}, "top_k"),
]


@pytest.mark.parametrize(("body", "said"), BAD, ids=[said for _, said in BAD])
def test_bad_input_gets_anthropics_error_and_nothing_is_enqueued(pool, body, said):
    before = len(job_ids(pool.r))
    with pool.http() as http:
        resp = http.post("/v1/messages", json={"model": MODEL, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and said in error["error"]["message"]
    assert len(job_ids(pool.r)) == before


def test_a_client_that_reconnects_with_last_event_id_gets_the_rest(pool):
    body = {**GREEDY, "model": MODEL, "max_tokens": 32, "messages": ASK, "stream": True}
    with pool.http() as http:
        with http.stream("POST", "/v1/messages", json=body) as resp:
            first = []
            for event in sse(resp.iter_lines()):
                first.append(event)
                if len(first) == 6:
                    break  # the client goes away
        message_id = first[0][2]["message"]["id"]
        headers = {"Last-Event-ID": first[-1][0]}
        with http.stream("GET", f"/v1/messages/{message_id}?stream=true", headers=headers) as resp:
            rest = list(sse(resp.iter_lines()))
        whole = http.get(f"/v1/messages/{message_id}").json()
    events = first + rest
    assert [int(eid) for eid, _, _ in events] == list(range(len(events)))
    text = "".join(d["delta"]["text"] for _, kind, d in events if kind == "content_block_delta")
    assert text == whole["content"][0]["text"] and events[-1][1] == "message_stop"


def test_a_cursor_past_an_ended_messages_last_event_is_anthropics_400_at_once(pool):
    body = {**GREEDY, "model": MODEL, "max_tokens": 8, "messages": ASK}
    with pool.http() as http:
        message_id = http.post("/v1/messages", json=body).json()["id"]  # it has ended
        with http.stream("GET", f"/v1/messages/{message_id}?stream=true") as resp:
            whole = list(sse(resp.iter_lines()))
        last = int(whole[-1][0])
        assert whole[-1][1] == "message_stop"
        url, key = f"{pool.base}/v1/messages/{message_id}?stream=true", {"x-api-key": KEY}
        for n in (last + 1, 10**9):
            for query, headers in ((f"&starting_after={n}", key), ("", {**key, "Last-Event-ID": str(n)})):
                error, took = refused_at_once(url + query, headers)
                assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
                assert took < 2.0, f"{took:.2f}s"
        # At the last event or before it, the stream is as before: the events after it, if any.
        for n in (last - 1, last):
            with http.stream("GET", f"/v1/messages/{message_id}?stream=true&starting_after={n}") as resp:
                assert resp.status_code == 200 and list(sse(resp.iter_lines())) == whole[n + 1 :]


def _node(pool: Pool, case: str) -> dict:
    """One case of tests/js/messages.mjs (@anthropic-ai/sdk) against the pool."""
    return run_node("messages.mjs", "@anthropic-ai/sdk", pool.base, KEY, MODEL, case)


def test_the_typescript_sdk_streams_creates_and_counts(pool):
    got = _node(pool, "stream")
    assert got["text"] and got["text"] == got["final_text"] == got["created_text"]
    assert got["kinds"][0] == "message_start" and got["kinds"][-2:] == ["message_delta", "message_stop"]
    assert got["counted"] == got["usage"]["input_tokens"] + got["usage"]["cache_read_input_tokens"]


def test_the_typescript_sdk_makes_a_tool_call_and_sends_its_result(pool):
    got = _node(pool, "tool")
    assert got["stop_reason"] == "tool_use" and got["streamed"] == got["input"] and got["input"]["story"]
    assert got["answer"] == ["text"]


def test_the_typescript_sdk_reads_anthropics_errors(pool):
    got = _node(pool, "errors")
    assert got == {
        "bad": ["BadRequestError", 400, "invalid_request_error"],
        "missing": ["NotFoundError", 404, "not_found_error"],
        "key": ["AuthenticationError", 401, "authentication_error"],
    }


def test_a_worker_killed_in_the_middle_of_a_tool_calls_arguments(pool):
    """The last test of the module: a worker is gone after it."""
    ask = [{"role": "user", "content": "Write and save a story about a fox."}]
    body = {**GREEDY, "model": MODEL, "max_tokens": 300, "tools": [STORY_TOOL], "messages": ask}
    body["tool_choice"] = {"type": "any", "disable_parallel_tool_use": True}
    with pool.http() as http:
        parts, killed, message_id = [], False, None
        with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as resp:
            for _, kind, data in sse(resp.iter_lines()):
                if kind == "message_start":
                    message_id = data["message"]["id"]
                if kind == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
                    parts.append(data["delta"]["partial_json"])
                    if len(parts) == 4:
                        pool.holder(message_id).signal(signal.SIGKILL)
                        killed = True
                last = kind
        assert killed and last == "message_stop"
        deadline = time.monotonic() + 60
        while (replay := http.get(f"/v1/messages/{message_id}")).status_code == 202:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    streamed = json.loads("".join(parts))  # valid JSON across the cut, and the replay's exactly
    assert streamed == replay.json()["content"][0]["input"] and len(streamed["story"]) >= 120
    events = pool.r.xrange(keys.events(message_id))
    assert sum(f[b"k"] == b"s" for _, f in events) == 2  # it went on on the other worker


# What Claude Code 2.1 sends (issue 75), each of which was refused on its first request.
CLAUDE_CODE_BETAS = [
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "advanced-tool-use-2025-11-20",
]
SEND_MESSAGE = {  # as Claude Code's own SendMessage and Workflow write theirs: for a validator
    "name": "SendMessage",
    "description": "Send a message to a teammate.",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "to": {"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
            "message": {"type": "string", "maxLength": 5000},
        },
        "required": ["to", "message"],
        "additionalProperties": False,
    },
}
DEFERRED = {
    "name": "WebFetch",
    "description": "Fetch a URL.",
    "input_schema": {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}},
    "defer_loading": True,
}
TOOL_SEARCH = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
INSTRUCTIONS = "You are Claude Code, Anthropic's official CLI for Claude. Answer in one short sentence. " * 6


def _claude_code_system(cch: str) -> list[dict]:
    """Claude Code's system blocks: the attribution line first, its `cch` new each request."""
    header = f"x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch={cch};"
    return [
        {"type": "text", "text": header},
        {"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}},
    ]


def test_what_claude_code_2_1_sends_is_answered_and_streamed(pool):
    """A mid-conversation system message, thinking shown as updates, context management that
    clears thinking, a deferred tool and tool search, a non-strict schema only a validator
    could hold, a tool_use block as the SDK dumps it (its `caller`), the attribution block
    and max_tokens 32,000 (this API's limit is CLAMPED): the beta SDK parses the stream."""
    call = anthropic.types.ToolUseBlock(
        id="toolu_1",
        name="SendMessage",
        input={"to": "ab", "message": "hi"},
        type="tool_use",
        caller=anthropic.types.DirectCaller(type="direct"),
    ).model_dump()
    assert "caller" in call
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Tell ab hi."}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sent."},
                {"type": "text", "text": "Is 17 a prime number?"},
            ],
        },
    ]
    with pool.sdk(pool.clamped).beta.messages.stream(
        model=THINKING,
        max_tokens=32000,
        system=_claude_code_system("3f2a1"),
        messages=messages,
        tools=[SEND_MESSAGE, DEFERRED, TOOL_SEARCH],
        thinking={"type": "enabled", "budget_tokens": 8, "display": "updates"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        betas=CLAUDE_CODE_BETAS,
        extra_body=GREEDY,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking  # updates: the text is shown
    assert final.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert final.usage.output_tokens <= CLAMPED
    assert final.stop_reason != "max_tokens" or final.usage.output_tokens == CLAMPED


def test_a_new_attribution_value_each_turn_still_reads_the_prefix_from_the_cache(pool):
    """Claude Code's `cch` changes every request; the second turn reads all of the first
    turn's prompt from the cache of the worker that ran it (cache-aware routing finds it)."""
    sdk = pool.sdk()
    ask = [{"role": "user", "content": "Say hello."}]
    first = sdk.messages.create(
        model=MODEL, max_tokens=8, system=_claude_code_system("3f2a1"), messages=ask, extra_body=GREEDY
    )
    prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    turn = [
        *ask,
        {"role": "assistant", "content": first.content[0].text},  # type: ignore[union-attr]
        {"role": "user", "content": "Again."},
    ]
    second = sdk.messages.create(
        model=MODEL, max_tokens=8, system=_claude_code_system("9c0d7"), messages=turn, extra_body=GREEDY
    )
    assert prompt > 100 and (second.usage.cache_read_input_tokens or 0) >= prompt - 4, second.usage
