"""`POST /v1/messages` bodies as chat jobs: blocks into the roles templates know, Anthropic's
controls into the job's, and each rule Anthropic keeps refused with a 400 naming where."""

from __future__ import annotations

import json

import pytest

from api.endpoints.messages.body import MessagesRequest
from api.endpoints.messages.routes import CountRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits
from contract.jobspec import Message, ToolCall

LIMITS = Limits()


def user(content) -> dict:
    return {"role": "user", "content": content}


def assistant(content) -> dict:
    return {"role": "assistant", "content": content}


TOOL = {"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def spec(body_type=MessagesRequest, **body):
    request = parse(body_type, json.dumps({"model": "m", "max_tokens": 16, **body}).encode())
    request.enforce(LIMITS)
    return request.to_spec("msg_x", LIMITS)


def refusal(**body) -> APIError:
    with pytest.raises(APIError) as caught:
        spec(**body)
    return caught.value


def test_blocks_become_the_turns_a_chat_template_knows():
    job = spec(
        system=[
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}},
        ],
        tools=[TOOL],
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "They ask.", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sun"}]},  # noqa: E501
                {"type": "text", "text": "Thanks."},
            ]},
        ],
    )  # fmt: skip
    assert job.kind == "chat" and job.max_tokens == 16 and job.temperature == 1.0
    assert job.messages == (
        Message("system", "Be brief.\n\nBe kind."),
        Message("user", "Weather?\n\nIn Paris."),  # turns of one role are joined
        Message(
            "assistant", "Let me look.", tool_calls=(ToolCall("toolu_1", "weather", '{"city": "Paris"}'),)
        ),
        Message("tool", "Sun", tool_call_id="toolu_1"),
        Message("user", "Thanks."),
    )


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        (None, "auto", True),
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "weather"}, "function:weather", True),
        ({"type": "none"}, "none", True),
    ],
)
def test_tool_choice(choice, expected, parallel):
    job = spec(tools=[TOOL], tool_choice=choice, messages=[{"role": "user", "content": "x"}])
    assert (job.tool_choice, job.parallel_tool_calls) == (expected, parallel)


def test_controls_reach_the_job():
    job = spec(
        messages=[{"role": "user", "content": "x"}],
        stop_sequences=["\nQ:"],
        temperature=0.2,
        top_k=5,
        thinking={"type": "disabled"},
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
    )
    assert job.stop == ("\nQ:",) and job.temperature == 0.2 and job.top_k == 5
    assert job.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    assert job.thinking_budget == 0
    budgeted = spec(
        max_tokens=4096, messages=[user("x")], thinking={"type": "enabled", "budget_tokens": 2048}
    )
    assert budgeted.thinking_budget == 2048 and budgeted.template_kwargs == {"enable_thinking": True}
    assert job.response_format == {"type": "json_schema", "schema": {"type": "object"}}


def test_a_tools_schema_is_loosened_unless_strict_and_its_examples_are_shown():
    uri = {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}}
    tool = {
        "name": "fetch",
        "description": "Fetch.",
        "input_schema": uri,
        "input_examples": [{"url": "https://a.b"}],
    }
    job = spec(tools=[tool], messages=[{"role": "user", "content": "x"}])
    assert job.tools[0].parameters == {"type": "object", "properties": {"url": {"type": "string"}}}
    assert job.tools[0].description == 'Fetch.\nExamples of input:\n{"url": "https://a.b"}'
    assert (
        "format"
        in refusal(tools=[{**tool, "strict": True}], messages=[{"role": "user", "content": "x"}]).message
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": [assistant("x"), user("y")]}, "first message"),
        ({"messages": [user("x"), assistant("y")]}, "prefill"),
        ({"messages": [user([{"type": "tool_result", "tool_use_id": "t"}])]}, "tool_use"),
        (
            {"messages": [user("x"), assistant([{"type": "tool_result", "tool_use_id": "t"}]), user("y")]},
            "user turns",
        ),
        ({"messages": [user([{"type": "thinking", "thinking": "t", "signature": "s"}])]}, "assistant turns"),
        ({"messages": [user([{"type": "document", "source": {}}])]}, "text only"),
        ({"messages": [user("x")], "thinking": {"type": "enabled", "budget_tokens": 2048}}, "budget"),
        ({"messages": [user("x")], "thinking": {"type": "enabled"}}, "budget_tokens"),
        ({"messages": [user("x")], "tool_choice": {"type": "tool"}}, "tool_choice"),
    ],
)
def test_anthropics_rules_are_kept(body, words):
    assert words in refusal(**body).message


def test_a_tool_result_must_answer_the_turn_just_before():
    turns = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
    ]
    assert spec(tools=[TOOL], messages=turns[:3]).messages[-1].role == "tool"
    assert "names none" in refusal(tools=[TOOL], messages=turns).message


def test_a_count_is_a_job_of_no_tokens():
    job = spec(CountRequest, max_tokens=None, messages=[{"role": "user", "content": "x"}])
    assert job.max_tokens == 0
    with pytest.raises(APIError):
        spec(CountRequest, messages=[{"role": "user", "content": "x"}])  # max_tokens is not a count's
