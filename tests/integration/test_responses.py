"""The Responses API with the real model and the official openai SDK in strict validation mode
(every event and object checked against the SDK's own types): streaming, background with
polling and with a stream cut and resumed by `starting_after`, cancel, delete, input items,
`previous_response_id` over three turns, item references, structured output, function calls,
key isolation, a worker SIGKILLed mid-response whose stream goes on without a gap; and what
Codex CLI sends (namespace and built-in tools, sealed reasoning sent back to another API
replica, tool outputs as parts), on a pool of its own."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import redis
from pydantic import BaseModel, Field

from contract import keys
from contract.entries import Delta
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_responses_stream
from tests.integration.conftest import MODEL, strict_sdk
from tests.integration.test_recovery import LONG, running_pool
from tests.integration.test_resume import refused_at_once
from tests.js_clients import run_node

pytestmark = pytest.mark.integration

STORY = LONG["content"]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("responses")) as p:
        yield p


@pytest.fixture
def sdk(pool):
    with strict_sdk(pool.base) as c:
        yield c


def _post_stream(base: str, body: dict, headers: dict | None = None) -> bytes:
    return httpx.post(
        base + "/v1/responses", json={**body, "stream": True}, headers=headers, timeout=120
    ).content


def _read_events(lines, count: int) -> tuple[str, int]:
    """Read SSE lines until `count` events have arrived: (the response id, the last number)."""
    rid, last, seen = "", -1, 0
    for line in lines:
        if line.startswith("data: "):
            event = json.loads(line[6:])
            rid = rid or event["response"]["id"]
            last, seen = event["sequence_number"], seen + 1
            if seen == count:
                break
    return rid, last


def _wait(sdk: openai.OpenAI, rid: str, until: tuple[str, ...], timeout: float = 60):
    deadline = time.monotonic() + timeout
    while (r := sdk.responses.retrieve(rid)).status not in until:
        assert time.monotonic() < deadline, r.status
        time.sleep(0.05)
    return r


def test_a_stream_keeps_the_contract_and_ends_as_the_stored_response(pool, sdk):
    raw = _post_stream(
        pool.base, {"model": MODEL, "input": "Say hi.", "max_output_tokens": 24, "temperature": 0}
    )
    parsed = check_responses_stream(raw)
    final = parsed.terminal["response"]
    assert final["status"] in ("completed", "incomplete") and parsed.text
    assert final["usage"]["output_tokens"] > 0 and final["output"][0]["content"][0]["text"] == parsed.text
    stored = sdk.responses.retrieve(final["id"])
    assert stored.model_dump(mode="json") == sdk.responses.retrieve(final["id"]).model_dump(mode="json")
    assert stored.output_text == parsed.text and stored.status == final["status"]

    events = list(sdk.responses.create(model=MODEL, input="Say hi.", stream=True, max_output_tokens=24))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in (
        "response.completed",
        "response.incomplete",
    )


def test_the_stream_helper_gets_the_final_response(sdk):
    with sdk.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=200, temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == text and text


def test_create_retrieve_input_items_and_delete(pool, sdk):
    r = sdk.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        instructions="Be brief.",
        max_output_tokens=8,
        metadata={"team": "a"},
        temperature=0,
    )
    assert r.status in ("completed", "incomplete") and r.output_text and r.id.startswith("resp_")
    assert r.instructions == "Be brief." and r.metadata == {"team": "a"} and r.usage.input_tokens > 0
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert sdk.responses.retrieve(r.id).model_dump() == r.model_dump()
    items = sdk.responses.input_items.list(r.id)
    assert [i.role for i in items.data] == ["user"] and items.data[0].content[0].text == "Say hi."
    sdk.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)
    metrics = httpx.get(pool.base + "/metrics", timeout=10).text
    assert 'tokenspool_jobs_created_total{surface="responses"}' in metrics


def test_input_items_page_in_both_orders(sdk):
    turns = [{"role": "user", "content": f"Message {n}."} for n in range(5)]
    r = sdk.responses.create(model=MODEL, input=turns, max_output_tokens=2)
    newest = [i.content[0].text for i in sdk.responses.input_items.list(r.id, limit=2)]
    assert newest == [f"Message {n}." for n in (4, 3, 2, 1, 0)]  # the SDK pages on by itself
    oldest = sdk.responses.input_items.list(r.id, limit=2, order="asc")
    assert [i.content[0].text for i in oldest] == [f"Message {n}." for n in range(5)]


def test_background_then_poll(sdk):
    r = sdk.responses.create(model=MODEL, input="Say hi.", background=True, max_output_tokens=12)
    assert r.status == "queued" and r.background and r.output == []
    done = _wait(sdk, r.id, ("completed", "incomplete"))
    assert done.output_text and done.background


def test_a_background_stream_cut_then_resumed_with_starting_after(pool, sdk):
    body = {"model": MODEL, "input": STORY, "background": True, "max_output_tokens": 60, "temperature": 0}
    with httpx.stream(
        "POST", pool.base + "/v1/responses", json={**body, "stream": True}, timeout=120
    ) as first:
        rid, last = _read_events(first.iter_lines(), 8)  # then the client goes away
    resumed = list(sdk.responses.retrieve(rid, stream=True, starting_after=last))
    assert [e.sequence_number for e in resumed] == list(range(last + 1, last + 1 + len(resumed)))
    assert resumed[-1].type in ("response.completed", "response.incomplete")  # the cut cancelled nothing
    final = resumed[-1].response
    raw = httpx.get(f"{pool.base}/v1/responses/{rid}?stream=true&starting_after={last}", timeout=60).content
    assert [e["sequence_number"] for e in check_responses_stream(raw, starting_after=last).events] == [
        e.sequence_number for e in resumed
    ]
    by_header = httpx.get(
        f"{pool.base}/v1/responses/{rid}?stream=true", headers={"Last-Event-ID": str(last)}, timeout=60
    )
    assert by_header.content == raw
    whole = check_responses_stream(
        httpx.get(f"{pool.base}/v1/responses/{rid}?stream=true", timeout=60).content
    )
    stored = httpx.get(f"{pool.base}/v1/responses/{rid}", timeout=10).json()
    assert whole.text == final.output_text and whole.events[-1]["response"] == stored
    # The SDK's helper replays from the start and drops what the client had.
    with sdk.responses.stream(response_id=rid, starting_after=last) as stream:
        helped = list(stream)
    assert [e.sequence_number for e in helped] == [e.sequence_number for e in resumed]
    assert helped[-1].response.output_text == final.output_text
    bad = httpx.get(f"{pool.base}/v1/responses/{rid}?stream=true&starting_after=x", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"


def test_a_cursor_past_an_ended_responses_last_event_is_400_at_once(pool, sdk):
    rid = sdk.responses.create(model=MODEL, input="Say hi.", background=True, max_output_tokens=12).id
    _wait(sdk, rid, ("completed", "incomplete"))
    url = f"{pool.base}/v1/responses/{rid}?stream=true"
    whole = check_responses_stream(httpx.get(url, timeout=60).content)
    last = whole.events[-1]["sequence_number"]
    for n in (last + 1, 10**9):
        for query, headers in ((f"&starting_after={n}", {}), ("", {"Last-Event-ID": str(n)})):
            error, took = refused_at_once(url + query, headers)
            assert error["error"]["code"] == "invalid_cursor" and error["error"]["param"] == "starting_after"
            assert took < 2.0, f"{took:.2f}s"
    # At the last event or before it, the stream is as before: the events after it, if any.
    at_last = httpx.get(f"{url}&starting_after={last}", timeout=10)
    assert (
        at_last.status_code == 200
        and check_responses_stream(at_last.content, last, complete=False).events == []
    )
    before_last = check_responses_stream(
        httpx.get(f"{url}&starting_after={last - 1}", timeout=10).content, last - 1
    )
    assert before_last.events == whole.events[-1:]


def test_a_background_response_outlives_the_api_process_that_streamed_it(pool, sdk, tmp_path):
    other, other_base = start_api(tmp_path, pool.redis_url)
    body = {"model": MODEL, "input": STORY, "background": True, "max_output_tokens": 60, "stream": True}
    with httpx.stream("POST", other_base + "/v1/responses", json=body, timeout=120) as first:
        rid, last = _read_events(first.iter_lines(), 8)
        other.signal(signal.SIGKILL)  # the API process dies under its client
    other.popen.wait()
    raw = httpx.get(f"{pool.base}/v1/responses/{rid}?stream=true&starting_after={last}", timeout=120).content
    rest = check_responses_stream(raw, starting_after=last)  # another replica, the same numbers
    assert rest.terminal["response"]["status"] in ("completed", "incomplete")
    whole = check_responses_stream(
        httpx.get(f"{pool.base}/v1/responses/{rid}?stream=true", timeout=60).content
    )
    assert whole.events[last + 1 :] == rest.events


def test_cancel_a_running_background_response(pool, sdk):
    r = sdk.responses.create(model=MODEL, input=STORY, background=True, max_output_tokens=400)
    _wait(sdk, r.id, ("in_progress",))
    cancelled = sdk.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    assert sdk.responses.retrieve(r.id).status == "cancelled"
    assert sdk.responses.cancel(r.id).status == "cancelled"  # again: the same answer
    raw = httpx.get(f"{pool.base}/v1/responses/{r.id}?stream=true", timeout=30).content
    assert check_responses_stream(raw, complete=False).terminal is None  # no SDK knows a cancelled event
    done = sdk.responses.create(model=MODEL, input="Hi", background=True, max_output_tokens=2)
    _wait(sdk, done.id, ("completed", "incomplete"))
    with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
        sdk.responses.cancel(done.id)
    plain = sdk.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        sdk.responses.cancel(plain.id)


def _spec(pool, rid: str) -> dict:
    return json.loads(pool.r.hget(keys.job(rid), keys.JobField.SPEC))


def test_previous_response_id_over_three_turns(pool, sdk):
    asked = ["My name is Ada.", "What is my name?", "Say it again."]
    r1 = sdk.responses.create(
        model=MODEL, input=asked[0], instructions="Answer briefly.", max_output_tokens=8
    )
    r2 = sdk.responses.create(model=MODEL, previous_response_id=r1.id, input=asked[1], max_output_tokens=8)
    r3 = sdk.responses.create(model=MODEL, previous_response_id=r2.id, input=asked[2], max_output_tokens=8)
    assert r3.previous_response_id == r2.id and r3.output_text
    messages = _spec(pool, r3.id)["messages"]  # instructions do not carry over
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages] == [asked[0], r1.output_text, asked[1], r2.output_text, asked[2]]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model=MODEL, previous_response_id="resp_" + "x" * 25, input="Hi")


def test_an_item_reference_brings_back_an_earlier_output(pool, sdk):
    r1 = sdk.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8)
    r2 = sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Say hi."},
            {"type": "item_reference", "id": r1.output[0].id},
            {"role": "user", "content": "Again."},
        ],
        max_output_tokens=4,
    )
    assert [m["content"] for m in _spec(pool, r2.id)["messages"]] == ["Say hi.", r1.output_text, "Again."]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_nope_0"}])


class City(BaseModel):  # bounded: a 135M model repeats itself inside an unbounded string
    name: str = Field(max_length=30)
    population: int = Field(ge=0, le=100_000_000)


def test_structured_output_parses_into_the_model(sdk):
    r = sdk.responses.parse(model=MODEL, input="Describe Paris.", text_format=City, temperature=0)
    assert isinstance(r.output_parsed, City) and r.output_parsed.name
    assert r.text.format.type == "json_schema"


def test_a_function_call_and_its_output_in_the_next_turn(pool, sdk):
    raw = _post_stream(
        pool.base,
        {
            "model": MODEL,
            "input": "What is the weather in Paris?",
            "tools": [WEATHER],
            "tool_choice": "required",
        },
    )
    parsed = check_responses_stream(raw)
    kinds = [e["type"] for e in parsed.events]
    assert (
        "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    )
    call = parsed.terminal["response"]["output"][0]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"])["city"] and call["call_id"].startswith("call_")

    again = sdk.responses.create(
        model=MODEL,
        previous_response_id=parsed.terminal["response"]["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C."}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=16,
    )
    assert again.output_text
    messages = _spec(pool, again.id)["messages"]
    assert messages[1]["tool_calls"][0]["id"] == call["call_id"] and messages[2]["role"] == "tool"
    with pytest.raises(openai.BadRequestError, match="No tool call found"):
        sdk.responses.create(
            model=MODEL, input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        )


def test_store_false_is_never_found_again(sdk):
    r = sdk.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=2)
    assert r.store is False and r.status in ("completed", "incomplete")
    for call in (lambda: sdk.responses.retrieve(r.id), lambda: sdk.responses.input_items.list(r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model=MODEL, input="Hi", previous_response_id=r.id)
    with pytest.raises(openai.BadRequestError, match="store"):
        sdk.responses.create(model=MODEL, input="Hi", store=False, background=True)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "include[0]", "invalid_value"),
        ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice", None),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort", None),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].image_url",
            None,
        ),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name", None),
        ({"input": "x", "max_output_tokens": 10**6}, "max_output_tokens", None),
        ({"input": []}, "input", None),
    ],
)
def test_bad_requests_are_refused_and_nothing_is_queued(pool, body, param, code):
    before = pool.r.dbsize()
    r = httpx.post(pool.base + "/v1/responses", json={"model": MODEL, **body}, timeout=10)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param:
        assert error["param"] == param
    if code:
        assert error["code"] == code
    assert pool.r.dbsize() == before


def test_another_key_finds_nothing(pool, tmp_path):
    api, base = start_api(tmp_path, pool.redis_url, env={"API_KEYS": "alpha,beta"})
    try:
        a, b = ({"Authorization": f"Bearer {k}"} for k in ("alpha", "beta"))
        body = {"model": MODEL, "input": "Hi", "background": True, "max_output_tokens": 2}
        rid = httpx.post(base + "/v1/responses", json=body, headers=a, timeout=30).json()["id"]
        for method, path in (
            ("GET", f"/v1/responses/{rid}"),
            ("GET", f"/v1/responses/{rid}?stream=true"),
            ("GET", f"/v1/responses/{rid}/input_items"),
            ("POST", f"/v1/responses/{rid}/cancel"),
            ("DELETE", f"/v1/responses/{rid}"),
        ):
            assert httpx.request(method, base + path, headers=b, timeout=30).status_code == 404, path
        follow = {"model": MODEL, "input": "Hi", "previous_response_id": rid}
        assert httpx.post(base + "/v1/responses", json=follow, headers=b, timeout=30).status_code == 404
        assert httpx.get(f"{base}/v1/responses/{rid}", headers=a, timeout=30).status_code == 200
    finally:
        api.stop()


def test_a_worker_killed_mid_response_is_resumed_without_a_gap(pool, sdk):
    pool.ensure(2)
    stream = sdk.responses.create(model=MODEL, input=STORY, stream=True, max_output_tokens=60, temperature=0)
    events, killed = [], False
    for event in stream:
        events.append(event)
        if not killed and sum(e.type == "response.output_text.delta" for e in events) == 10:
            pool.holder(events[0].response.id).signal(signal.SIGKILL)
            killed = True
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.response.output_text
    rid = final.response.id
    assert sum(1 for e in pool.events(rid) if type(e).__name__ == "Started") == 2  # it ran twice
    tokens = sum(len(e.token_ids) for e in pool.events(rid) if isinstance(e, Delta))
    assert final.response.usage.output_tokens == tokens


def _node(pool, case: str) -> dict:
    """One case of tests/js/responses.mjs (openai-node, the AI SDK) against the pool."""
    return run_node("responses.mjs", "@ai-sdk/openai", pool.base, MODEL, case)


def test_openai_node_stream_helper(pool):
    got = _node(pool, "helper")
    assert got["status"] == "completed" and got["text"] and got["text"] == got["output_text"]
    assert got["seqs"] == list(range(len(got["seqs"])))


def test_openai_node_resumes_with_starting_after(pool):
    got = _node(pool, "resume")
    last, seqs = got["last"], got["seqs"]
    assert seqs == list(range(last + 1, last + 1 + len(seqs))) and got["helpedSeqs"] == seqs
    assert got["status"] in ("completed", "incomplete") and got["snapshot_status"] == got["status"]
    stored = httpx.get(f"{pool.base}/v1/responses/{got['id']}", timeout=10).json()
    assert got["text"] == stored["output"][0]["content"][0]["text"]  # nothing lost or repeated


def test_ai_sdk_stream_text(pool):
    got = _node(pool, "ai-text")
    assert got["errors"] == [] and got["text"] and got["finishReason"] in ("stop", "length")
    assert got["usage"]["outputTokens"] > 0


def test_ai_sdk_tool_call(pool):
    got = _node(pool, "ai-tool")
    assert got["errors"] == [] and got["finishReason"] == "tool-calls"
    assert [c["name"] for c in got["calls"]][:1] == ["get_weather"] and got["calls"][0]["input"]["city"]


# What Codex CLI 0.171 sends (its default config): function tools, a `namespace` of them (its
# sub-agents' and MCP servers' tools), the built-in `web_search`, `include` of the sealed
# reasoning, `prompt_cache_key`, `client_metadata`, `store: false`, no `max_output_tokens`.
THINKING = "smollm2-thinking"
TEMPLATE = str(Path(__file__).resolve().parent.parent / "data" / "thinking-chatml.jinja")
ALPHA, BETA = ({"Authorization": f"Bearer {k}"} for k in ("alpha", "beta"))
SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Spawn a sub-agent for a well-scoped task.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"message": {"type": "string", "minLength": 1, "maxLength": 12}},
        "required": ["message"],
        "additionalProperties": False,
    },
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [SPAWN],
}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
CODEX_TOOLS = [EXEC, AGENTS, {"type": "web_search", "external_web_access": False}]
CODEX = {
    "model": THINKING,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
    ],
    "tools": CODEX_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a23480-8f36-7060-9188-1ee1fb2ae954",
    "client_metadata": {"turn_id": "01a23480-8f67", "x-codex-turn-metadata": '{"session_id":"01a2"}'},
}


@dataclass
class Replicas:
    """Two API processes of one Redis, keys alpha and beta, no REASONING_SEAL_SECRETS (they
    share the secret the first that needs one keeps in Redis), and a worker of the default
    model behind a template that opens `<think>`: every answer starts with thinking."""

    bases: tuple[str, str]
    url: str
    r: redis.Redis

    def sdk(self, replica: int = 0, key: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.bases[replica] + "/v1",
            api_key=key,
            max_retries=0,
            timeout=120,
            _strict_response_validation=True,
        )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[Replicas]:
    logs = tmp_path_factory.mktemp("responses-codex")
    redis_proc, url = start_redis(logs)
    env = {"API_KEYS": "alpha,beta", "MAX_TOKENS_LIMIT": "64"}  # Codex asks for no limit: this one
    one, base_one = start_api(logs, url, env=env)
    two, base_two = start_api(logs, url, name="api2", env=env)
    worker = start_worker(logs, url, env={"CHAT_TEMPLATE_FILE": TEMPLATE, "MODEL_NAME": THINKING})
    try:
        for base in (base_one, base_two):
            wait_for_model(base, THINKING, procs=(one, two, worker), headers=ALPHA)
        yield Replicas((base_one, base_two), url, redis.Redis.from_url(url))
    finally:
        for p in (worker, one, two, redis_proc):
            p.stop()


def _sealed_reasoning(output: list[dict]) -> dict:
    reasoning = output[0]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"]
    assert reasoning["encrypted_content"].startswith("ts1.")
    assert reasoning["content"][0]["text"] not in reasoning["encrypted_content"]
    return reasoning


def test_codex_s_request_is_answered_and_streamed(replicas):
    with httpx.stream(
        "POST", replicas.bases[0] + "/v1/responses", json=CODEX, headers=ALPHA, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["x-omitted-tools"] == "web_search"
        raw = r.read()
    parsed = check_responses_stream(raw)
    response = parsed.terminal["response"]
    assert response["status"] in ("completed", "incomplete") and response["store"] is False
    assert [t["type"] for t in response["tools"]] == ["function", "namespace"]  # web_search left out
    assert response["tools"][1]["tools"][0]["name"] == "spawn_agent"
    assert response["prompt_cache_key"] == CODEX["prompt_cache_key"]
    assert response["max_output_tokens"] is None and response["usage"]["output_tokens"] <= 64
    _sealed_reasoning(response["output"])
    done = [e["item"] for e in parsed.events if e["type"] == "response.output_item.done"]
    assert done[0]["encrypted_content"] == response["output"][0]["encrypted_content"]
    # the strict SDK reads every event of the same request
    kwargs = {k: v for k, v in CODEX.items() if k not in ("stream", "client_metadata", "instructions")}
    events = list(replicas.sdk().responses.create(**kwargs, extra_body={"client_metadata": {}}, stream=True))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status in ("completed", "incomplete") and final.output[0].type == "reasoning"
    with pytest.raises(openai.NotFoundError):  # store: false
        replicas.sdk().responses.retrieve(final.id)


def test_hosted_tools_refused_where_the_operator_says_so(replicas, tmp_path):
    strict, base = start_api(tmp_path, replicas.url, env={"API_KEYS": "alpha", "HOSTED_TOOLS": "refuse"})
    try:
        r = httpx.post(base + "/v1/responses", json={**CODEX, "stream": False}, headers=ALPHA, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[2].type", r.text
        assert r.json()["error"]["code"] == "unsupported_parameter" and "web_search" in r.text
    finally:
        strict.stop()


def test_a_namespaced_call_and_its_output_text_parts_round_trip(replicas):
    first = replicas.sdk().responses.create(
        model=THINKING,
        input="Spawn an agent.",
        tools=[AGENTS, {"type": "web_search"}],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: a second one can run past the limit
        include=["reasoning.encrypted_content"],
        store=False,
        extra_body={"thinking_budget": 2},
        max_output_tokens=64,
        temperature=0,
    )
    assert first.status == "completed", first.output
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")  # as Codex routes it
    assert json.loads(call.arguments)["message"]
    reasoning = first.output[0].model_dump(exclude_none=True)
    output = [{"type": "output_text", "text": "agent "}, {"type": "output_text", "text": "a1 started"}]
    again = replicas.sdk(1).responses.create(  # the other replica
        model=THINKING,
        input=[
            {"role": "user", "content": "Spawn an agent."},
            reasoning,
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": output},
        ],
        tools=[AGENTS],
        tool_choice="none",
        max_output_tokens=4,
    )
    assert again.status in ("completed", "incomplete")
    messages = json.loads(replicas.r.hget(keys.job(again.id), keys.JobField.SPEC))["messages"]
    assert messages[1]["tool_calls"] == [
        {"id": call.call_id, "name": "multi_agent_v1__spawn_agent", "arguments": call.arguments}
    ]
    assert messages[1]["reasoning"] == reasoning["content"][0]["text"]
    assert messages[2] == {"role": "tool", "content": "agent a1 started", "tool_call_id": call.call_id}


def test_sealed_reasoning_comes_back_on_another_replica_and_only_for_its_key(replicas):
    asked = {
        "model": THINKING,
        "input": "Is 17 a prime number?",
        "max_output_tokens": 12,
        "store": False,
        "temperature": 0,  # sampled, the thought can end at once and leave no reasoning item
    }
    first = replicas.sdk(0).responses.create(**asked, include=["reasoning.encrypted_content"])
    reasoning = _sealed_reasoning([first.output[0].model_dump(exclude_none=True)])
    thought = reasoning["content"][0]["text"]
    assert replicas.r.get(keys.REASONING_SEAL)  # the secret both replicas share, made once

    def follow(item: dict) -> list:
        return [{"role": "user", "content": asked["input"]}, item, {"role": "user", "content": "And 18?"}]

    sealed_only = {k: v for k, v in reasoning.items() if k != "content"}  # the text comes from the seal
    again = replicas.sdk(1).responses.create(model=THINKING, input=follow(sealed_only), max_output_tokens=2)
    messages = json.loads(replicas.r.hget(keys.job(again.id), keys.JobField.SPEC))["messages"]
    assert messages[1] == {"role": "assistant", "content": "", "reasoning": thought}
    replicas.sdk(0).responses.create(
        model=THINKING, input=follow(reasoning), max_output_tokens=2, store=False
    )

    sealed = reasoning["encrypted_content"]
    tampered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    for key, item in (
        ("alpha", {**reasoning, "encrypted_content": tampered}),
        ("alpha", {**reasoning, "encrypted_content": "ts1.00000000.AAAA"}),
        ("beta", reasoning),  # sealed for alpha
    ):
        for replica in (0, 1):
            with pytest.raises(openai.BadRequestError) as caught:
                replicas.sdk(replica, key).responses.create(
                    model=THINKING, input=follow(item), max_output_tokens=2
                )
            error = caught.value.body
            assert isinstance(error, dict) and error["code"] == "invalid_encrypted_content"
            assert error["param"] == "input[1].encrypted_content"
