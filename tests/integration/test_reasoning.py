"""A reasoning model's thinking through real processes: the default model behind a chat
template that opens `<think>` in its generation prompt (tests/data/thinking-chatml.jinja),
so its output starts inside the block, as DeepSeek-R1 distills' and Qwen3's thinking models'
do. The plumbing does not depend on the weights; SmolLM2 never closes the block on its own,
so what these tests see is thinking, and the raw text a REASONING_FORMAT=none worker gives
for the same greedy request is the oracle of the split."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from tests.integration.thinking import Pool, killed_mid_thinking
from tests.js_clients import run_node

pytestmark = pytest.mark.integration

TEMPLATE = str(Path(__file__).resolve().parent.parent / "data" / "thinking-chatml.jinja")
THINKING, RAW = "smollm2-thinking", "smollm2-thinking-raw"
MESSAGES = [{"role": "user", "content": "Is 17 a prime number?"}]
A_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    """Two workers splitting the thinking (a killed one's job goes on on the other) and one
    leaving the text raw, all of the same weights and template; one API."""
    logs = tmp_path_factory.mktemp("reasoning")
    redis_proc, url = start_redis(logs)
    api, base = start_api(logs, url, env={"KEEPALIVE_SECONDS": "0.5", "REAPER_INTERVAL_SECONDS": "0.2"})
    env = {"CHAT_TEMPLATE_FILE": TEMPLATE, "SLOTS": "1", "HEARTBEAT_WINDOW_SECONDS": "2"}
    workers = {
        name: start_worker(logs, url, name=name, env=env | {"MODEL_NAME": model, **extra})
        for name, model, extra in (
            ("t1", THINKING, {}),
            ("t2", THINKING, {}),
            ("raw", RAW, {"REASONING_FORMAT": "none"}),
        )
    }
    try:
        for model in (THINKING, RAW):
            wait_for_model(base, model, procs=(api, *workers.values()))
        yield Pool(base, redis.Redis.from_url(url), workers)
    finally:
        for p in (*workers.values(), api, redis_proc):
            p.stop()


def raw_text(pool: Pool, max_tokens: int) -> str:
    done = pool.sdk().chat.completions.create(
        model=RAW, messages=MESSAGES, max_tokens=max_tokens, temperature=0
    )
    return done.choices[0].message.content or ""


def test_thinking_streams_in_its_own_field_and_never_as_content(pool):
    raw = raw_text(pool, 24)
    stream = pool.sdk().chat.completions.create(
        model=THINKING,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    thought, said = "".join(reasoning), "".join(content)
    assert thought and "<think>" not in said and "</think>" not in thought
    # the raw text is the thinking, then (if the model closed the block) the tag and the answer
    assert raw.startswith(thought) and (not said or raw.endswith(said)), (raw, thought, said)
    assert finish in ("length", "stop")  # the model may end its turn inside the block
    assert usage is not None and usage.completion_tokens_details is not None
    reasoning_tokens = usage.completion_tokens_details.reasoning_tokens
    assert reasoning_tokens == usage.completion_tokens if not said else 0 < reasoning_tokens < 24

    done = pool.sdk().chat.completions.create(model=THINKING, messages=MESSAGES, max_tokens=24, temperature=0)
    message = done.choices[0].message
    assert getattr(message, "reasoning_content", None) == thought and (message.content or "") == said
    assert done.usage is not None and done.usage.completion_tokens_details is not None
    assert done.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


def test_the_responses_api_gives_the_thinking_a_reasoning_item_before_the_message(pool):
    sdk = pool.sdk()
    chat = sdk.chat.completions.create(model=THINKING, messages=MESSAGES, max_tokens=24, temperature=0)
    thought = getattr(chat.choices[0].message, "reasoning_content", None)
    kwargs = {"model": THINKING, "input": MESSAGES[0]["content"], "max_output_tokens": 24, "temperature": 0}
    done = sdk.responses.create(**kwargs)
    reasoning = done.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert "".join(c.text for c in reasoning.content) == thought
    assert done.usage is not None and done.usage.output_tokens_details.reasoning_tokens > 0
    streamed = [event.type for event in sdk.responses.create(**kwargs, stream=True)]
    assert streamed.count("response.reasoning_text.delta") > 0 and "response.reasoning_text.done" in streamed
    assert streamed.index("response.reasoning_text.done") < len(streamed) - 1


@pytest.mark.parametrize(
    "control",
    [{"reasoning_effort": "none"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}],
    ids=["reasoning_effort none", "enable_thinking false"],
)
def test_thinking_turned_off_leaves_the_answer_alone(pool, control):
    """The template writes the block empty and closed: nothing is thinking."""
    done = pool.sdk().chat.completions.create(
        model=THINKING, messages=MESSAGES, max_tokens=16, temperature=0, **control
    )
    message = done.choices[0].message
    assert message.content and not getattr(message, "reasoning_content", None)
    assert done.usage is not None and done.usage.completion_tokens_details is not None
    assert done.usage.completion_tokens_details.reasoning_tokens == 0
    responses = pool.sdk().responses.create(
        model=THINKING,
        input=MESSAGES[0]["content"],
        max_output_tokens=16,
        temperature=0,
        reasoning={"effort": "none"},
    )
    assert [item.type for item in responses.output] == ["message"] and responses.reasoning is not None
    assert responses.reasoning.effort == "none"


def test_a_thinking_budget_lets_the_answer_follow_on_chat_and_responses(pool):
    """SmolLM2 never closes the block its template opens: the worker closes it after 6 tokens."""
    sdk = pool.sdk()
    chunks = sdk.chat.completions.create(
        model=THINKING, messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"thinking_budget": 6},
    )  # fmt: skip
    reasoning, content, usage = [], [], None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    said = "".join(content)
    assert (
        "".join(reasoning) and said.strip() and not said.startswith(("\n", "</think>"))
    )  # the close is nobody's
    assert usage is not None and usage.completion_tokens_details is not None
    assert 6 < usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens <= 24
    done = sdk.responses.create(
        model=THINKING, input=MESSAGES[0]["content"], max_output_tokens=24, temperature=0,
        extra_body={"thinking_budget": 6},
    )  # fmt: skip
    assert [item.type for item in done.output] == ["reasoning", "message"] and done.output_text == said


@pytest.mark.parametrize(
    "constraint",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": A_SCHEMA}}},
        {"tools": [TOOL], "tool_choice": "required"},
    ],
    ids=["response_format", "forced tool call"],
)
def test_the_grammar_holds_from_where_the_thinking_ends(pool, constraint):
    """The template opens the block: the thinking is free, the answer is held by the grammar
    from the block's close on (the budget closes it: SmolLM2 never does). Without the budget
    the output is all thinking: the grammar never started."""
    ask = {"model": THINKING, "messages": [{"role": "user", "content": "Give a JSON object with a key a."}]}
    kwargs = {**ask, **constraint, "max_tokens": 64, "temperature": 0}
    message = (
        pool.sdk().chat.completions.create(**kwargs, extra_body={"thinking_budget": 6}).choices[0].message
    )
    assert getattr(message, "reasoning_content", None)
    if "tools" in constraint:
        assert message.tool_calls and json.loads(message.tool_calls[0].function.arguments)["city"]
    else:
        assert isinstance(json.loads(message.content or "")["a"], int), message.content
    unbounded = pool.sdk().chat.completions.create(**{**kwargs, "max_tokens": 16}).choices[0].message
    assert (
        getattr(unbounded, "reasoning_content", None) and not unbounded.content and not unbounded.tool_calls
    )


def test_openai_node_reads_the_thinking_apart_on_chat_and_responses(pool):
    """tests/js/reasoning.mjs: chat's reasoning_content deltas, and the Responses helper's
    reasoning item and events (the helper throws on an event it cannot place)."""
    got = run_node("reasoning.mjs", "openai", pool.base, THINKING)
    assert got["chatThinking"] and got["chatContent"].strip() and "<think>" not in got["chatContent"]
    assert (
        got["items"] == ["reasoning", "message"] and got["itemText"] == got["deltas"] == got["chatThinking"]
    )
    assert got["outputText"] == got["chatContent"] and "response.reasoning_text.done" in got["kinds"]


def test_a_worker_killed_mid_thinking_leaves_the_split_whole(pool):
    """The client's stitched stream and the replay after the end agree, the continuation
    having read the earlier attempt's text again (its split across the cut: the unit tests
    of worker/text/thinking.py and the runner's). The last test of the module: a worker is
    gone after it."""
    killed_mid_thinking(pool, THINKING, MESSAGES, "<think>")
