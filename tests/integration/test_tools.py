"""Structured output, tool calls, logprobs and the sampling extensions, with the real model and
the real clients: the openai SDK (`parse`, streamed tool calls accumulated its way),
langchain-openai and a pydantic-ai agent; and a worker SIGKILLed in the middle of a JSON
answer or of a call's arguments, whose client still gets valid JSON."""

from __future__ import annotations

import json
import signal
from typing import Annotated

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from devstack.processes import start_worker, wait_for_model
from tests.integration.conftest import MODEL
from tests.integration.test_recovery import running_pool

pytestmark = pytest.mark.integration

HERMES_TEMPLATE = "tests/data/hermes-chatml.jinja"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("tools")) as p:
        yield p


@pytest.fixture
def sdk(pool):
    with openai.OpenAI(base_url=pool.base + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


# Bounded strings: a 135M model greedily repeats itself inside an unbounded one until max_tokens.
class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=120)  # an integer range: enforced digit by digit
    hobbies: list[Annotated[str, Field(max_length=24)]] = Field(max_length=3)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}},
            "required": ["zone"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_parse_with_a_pydantic_model(sdk):
    done = sdk.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
        temperature=0,
    )
    person = done.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and len(person.hobbies) <= 3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_json_schema_stream_is_valid_json_for_the_schema(sdk, temperature):
    schema = Person.model_json_schema()
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a person."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
            temperature=temperature,
            seed=7,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object(sdk):
    done = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=300,
    )
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(done.choices[0].message.content), dict)


def test_a_required_tool_call_streams_openai_style(sdk):
    stream = sdk.chat.completions.create(
        model=MODEL, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", temperature=0, stream=True
    )
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    firsts = [tc for tc in calls if tc.id]
    assert firsts and all(tc.type == "function" and tc.function.name == "get_weather" for tc in firsts)
    assert all(tc.id.startswith("call_") for tc in firsts)
    assert all(tc.function.name is None for tc in calls if not tc.id)  # fragments carry arguments only
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    for i, first in enumerate(firsts):
        args = "".join(tc.function.arguments or "" for tc in calls if tc.index == i)
        jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
        assert first.index == i


def test_the_stream_helper_accumulates_the_calls(sdk):
    with sdk.chat.completions.stream(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_named_tool_is_the_one_called_and_the_answer_does_not_stream(sdk):
    done = sdk.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        temperature=0,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time" and "zone" in json.loads(call.function.arguments)


def test_a_tool_round_trip_continues_the_conversation(sdk):
    first = sdk.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        parallel_tool_calls=False,
    )
    message = first.choices[0].message
    call = message.tool_calls[0]
    history = [
        *ASK_WEATHER,
        message,  # the SDK's own object, sent back as it is
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"},
    ]
    second = sdk.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=40
    )
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_logprobs_for_chat_and_legacy_completions(sdk):
    done = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
    )
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens
    assert "".join(t.token for t in content) == done.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob == t.logprob  # greedy: the most likely token
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    streamed = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hi."}],
            temperature=0,
            max_tokens=8,
            logprobs=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    tokens = [
        t.token
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    # Each chunk carries its own tokens' logprobs. (Not compared with the answer above: a
    # prompt read from the prefix cache can flip a near tie of greedy picks.)
    assert "".join(tokens) == "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert len(tokens) == streamed[-1].usage.completion_tokens
    legacy = sdk.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
    )
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.top_logprobs[0]) == 2
    assert lp.text_offset[0] == 0


def _text(sdk, prompt: str = "Name three fruits.", max_tokens: int = 12, **kw) -> str:
    done = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, **kw
    )
    return done.choices[0].message.content


def test_the_sampling_extensions_take_effect(pool, sdk):
    greedy = _text(sdk, temperature=0)
    # only the most likely token survives top_k=1 or min_p=1: a hot draw is the greedy answer
    assert _text(sdk, temperature=1.5, seed=1, extra_body={"top_k": 1}) == greedy
    assert _text(sdk, temperature=1.5, seed=1, extra_body={"min_p": 1.0}) == greedy
    # logit_bias by token id (the job's stream records the ids of what it generated)
    first = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three fruits."}], max_tokens=1, temperature=0
    )
    (token,) = next(e for e in pool.events(first.id) if type(e).__name__ == "Delta").token_ids
    banned = _text(sdk, temperature=0, logit_bias={str(token): -100})
    assert not banned.startswith(first.choices[0].message.content)
    counting = "Count from one to twenty in words, separated by commas."
    plain = _text(sdk, counting, 40, temperature=0)
    assert len(plain) > 2 * len(set(plain))  # the greedy answer repeats itself...
    penalised = _text(sdk, counting, 40, temperature=0, extra_body={"repeat_penalty": 5.0})
    assert penalised != plain  # ...and a repeat penalty changes it


def test_a_schema_the_grammar_cannot_enforce_is_refused_and_nothing_is_queued(pool):
    queued = pool.r.llen(f"rq:queue:{MODEL}")
    body = {
        "model": MODEL,
        "messages": ASK_WEATHER,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"n": {"type": "number", "minimum": 1}}},
            },
        },
    }
    r = httpx.post(pool.base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (
        error["param"] == "response_format.json_schema.schema" and "/properties/n/minimum" in error["message"]
    )
    assert pool.r.llen(f"rq:queue:{MODEL}") == queued


def test_langchain_bind_tools_and_structured_output(pool):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    class City(BaseModel):
        city: str = Field(max_length=40)  # bounded, as Person's strings are

    @tool(args_schema=City)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL, base_url=pool.base + "/v1", api_key="unused", temperature=0, max_retries=0)
    # one call: with parallel calls allowed, this model repeats its call until the context is full
    one = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    message = one.invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    assert isinstance(message.tool_calls[0]["args"]["city"], str)
    streamed = None
    for chunk in llm.bind_tools([get_weather], tool_choice="required").stream("Weather in Oslo?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls and streamed.tool_calls[0]["name"] == "get_weather"
    person = llm.with_structured_output(Person, method="json_schema").invoke("Describe a person.")
    assert isinstance(person, Person)


def test_a_pydantic_ai_agent_runs_a_tool_round_trip(pool):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Weather(BaseModel):
        city: str = Field(max_length=40)
        summary: str = Field(max_length=80)

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=pool.base + "/v1", api_key="unused"))
    agent = Agent(model, output_type=Weather, model_settings={"temperature": 0})
    called: list[str] = []

    async def once(ctx, tool_def):  # offered until called: then only the output tool is left
        return None if called else tool_def

    @agent.tool_plain(prepare=once)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return "22 degrees and sunny"

    result = agent.run_sync("Use get_weather to find the weather in Paris, then report it.")
    assert isinstance(result.output, Weather)
    assert called, "the agent never called the tool"


@pytest.mark.parametrize("what", ["json_schema", "tool_call"])
def test_a_worker_killed_mid_json_leaves_the_client_valid_json(pool, sdk, what):
    """The continuation replays the published tokens through the grammar: the resumed output
    still parses and validates."""
    pool.ensure(2)
    items = {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 12, "maxItems": 12}
    schema = {"type": "object", "properties": {"names": items}, "required": ["names"]}
    kw: dict = {"model": MODEL, "temperature": 0, "stream": True}
    if what == "json_schema":
        kw |= {
            "messages": [{"role": "user", "content": "List twelve names of ships."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "ships", "schema": schema}},
        }
    else:
        tool = {"type": "function", "function": {"name": "save_ships", "parameters": schema}}
        kw |= {
            "messages": [{"role": "user", "content": "Save twelve names of ships."}],
            "tools": [tool],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    text, args, outputs, job_id, finish = [], [], 0, "", None
    for chunk in sdk.chat.completions.create(**kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content or delta.tool_calls:
            outputs += 1
            if outputs == 12:  # mid-answer: the worker dies, the stream goes on
                job_id = chunk.id
                pool.holder(job_id).signal(signal.SIGKILL)
        text.append(delta.content or "")
        args += [tc.function.arguments or "" for tc in delta.tool_calls or ()]
        finish = chunk.choices[0].finish_reason or finish
    assert job_id, "the stream ended before the kill"
    out = json.loads("".join(text) if what == "json_schema" else "".join(args))
    jsonschema.validate(out, schema)
    assert finish == ("stop" if what == "json_schema" else "tool_calls")
    starts = [e for e in pool.events(job_id) if type(e).__name__ == "Started"]
    assert len(starts) == 2  # it did resume on the other worker


@pytest.fixture(scope="module")
def hermes(pool):
    """A worker whose template speaks Hermes tool calls (`<tool_call>...</tool_call>`)."""
    model = "smollm2-hermes"
    worker = start_worker(
        pool.logs,
        pool.redis_url,
        name="hermes",
        env={"MODEL_NAME": model, "CHAT_TEMPLATE_FILE": HERMES_TEMPLATE, "SLOTS": "1"},
    )
    try:
        wait_for_model(pool.base, model, procs=(worker,))
        assert "hermes protocol" in worker.log()
        yield model
    finally:
        worker.signal(signal.SIGKILL)


def test_a_hermes_template_renders_the_tools_and_its_calls_are_parsed(pool, sdk, hermes):
    done = sdk.chat.completions.create(
        model=hermes,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        parallel_tool_calls=False,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    jsonschema.validate(
        json.loads(choice.message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"]
    )
    follow = sdk.chat.completions.create(
        model=hermes,
        messages=[
            *ASK_WEATHER,
            choice.message,
            {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "sunny"},
        ],
        tools=[WEATHER],
        temperature=0,
        max_tokens=30,
    )
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_an_auto_hermes_answer_is_text_or_a_call_to_an_offered_tool(pool, sdk, hermes):
    """tool_choice auto on the Hermes protocol runs with its call grammar armed for the first
    `<tool_call>` (worker/engine/grammar.py): whatever the model writes, a call it makes is valid."""
    for question in ASK_WEATHER, [{"role": "user", "content": "Call get_time for Europe/Paris."}]:
        done = sdk.chat.completions.create(
            model=hermes, messages=question, tools=[WEATHER, TIME], temperature=0, max_tokens=60
        )
        choice = done.choices[0]
        for call in choice.message.tool_calls or []:
            tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
        else:
            assert choice.finish_reason in ("stop", "length") and choice.message.content
