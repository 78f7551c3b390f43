"""A Responses request becomes a chat job: its input items as messages, with the earlier
conversation in front, and every field it does not implement refused by name."""

from __future__ import annotations

import json

import pytest

from api.endpoints.responses.body import ResponsesRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits
from contract.jobspec import NAMED, Message, ToolCall
from contract.keys import JobField

LIMITS = Limits()
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def body(**kw) -> ResponsesRequest:
    return parse(ResponsesRequest, json.dumps({"model": "m", **kw}).encode())


def err(**kw) -> APIError:
    with pytest.raises(APIError) as caught:
        b = body(**kw)
        b.enforce(LIMITS)
        b.to_spec("resp_x", LIMITS)
    return caught.value


def test_a_string_input_is_one_user_message_after_the_instructions():
    spec = body(input="Hi", instructions="Be brief.", max_output_tokens=5, temperature=0.5).to_spec(
        "resp_x", LIMITS
    )
    assert spec.kind == "chat" and spec.max_tokens == 5 and spec.temperature == 0.5
    assert spec.messages == (Message("system", "Be brief."), Message("user", "Hi"))


def test_items_become_messages_with_calls_merged_into_the_assistant_turn():
    b = body(
        input=[
            {"role": "developer", "content": "Rules."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."},
        ],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.messages == (
        Message("system", "Rules."),
        Message("user", "Weather?"),
        Message("assistant", "Checking.", (ToolCall("call_1", "get_weather", "{}"),)),
        Message("tool", "Sunny.", tool_call_id="call_1"),
    )
    assert spec.tool_choice == NAMED + "get_weather" and spec.tools[0].name == "get_weather"
    stored = json.loads(b.job_fields("resp_x")[JobField.INPUT])
    assert [i["id"] for i in stored] == ["msg_x_in0", "msg_x_in1", "msg_x_in2", "fc_x_in3", "fco_x_in4"]
    assert (
        stored[2]["content"][0]["type"] == "output_text" and stored[1]["content"][0]["type"] == "input_text"
    )


def test_the_earlier_conversation_goes_before_the_input():
    b = body(input="And now?", instructions="New rules.", previous_response_id="resp_y")
    b.bind([Message("user", "Before."), Message("assistant", "Yes.")], {})
    assert [m.content for m in b.to_spec("resp_x", LIMITS).messages] == [
        "New rules.",
        "Before.",
        "Yes.",
        "And now?",
    ]
    assert b.prompt_chars() == (sum(map(len, ["New rules.", "Before.", "Yes.", "And now?"])), "input")


def test_the_echo_is_what_the_response_repeats():
    b = body(input="x", text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}})
    echo = json.loads(b.job_fields("resp_x")[JobField.ECHO])
    assert echo["format"] == {"type": "json_schema", "name": "p", "schema": {"type": "object"}}
    assert echo["store"] is True and echo["tool_choice"] == "auto" and echo["tools"] == []
    assert b.to_spec("resp_x", LIMITS).response_format == {
        "type": "json_schema",
        "schema": {"type": "object"},
    }
    assert JobField.KEEP_SPEC in b.job_fields("resp_x")
    assert JobField.KEEP_SPEC not in body(input="x", store=False).job_fields("resp_x")


@pytest.mark.parametrize(
    ("kw", "param", "words"),
    [
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort", ""),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include", "Unsupported parameter"),
        ({"input": "x", "top_logprobs": 2}, "top_logprobs", "Unsupported parameter"),
        ({"input": "x", "truncation": "auto"}, "truncation", ""),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, None, ""),
        ({"input": [{"type": "reasoning", "summary": []}]}, None, ""),
        ({"input": "x", "background": True, "store": False}, "store", "stored"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.name", "needs a name"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice", "only allowed when"),
        (
            {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
            None,
            "nope",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]},
            "input",
            "No tool call",
        ),
        ({"input": "x", "max_output_tokens": 10**7}, "max_output_tokens", "too large"),
        ({"input": "x", "metadata": {str(n): "v" for n in range(17)}}, "metadata", ""),
    ],
)
def test_what_cannot_run_is_a_400_naming_it(kw, param, words):
    error = err(**kw)
    assert error.status == 400 and words in error.message
    if param:
        assert error.param == param


def test_a_reasoning_effort_reaches_the_template_and_the_response_repeats_it():
    b = body(input="x", reasoning={"effort": "none", "summary": "auto"})
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    assert b.echo()["reasoning"] == {"effort": "none", "summary": "auto"}
    assert body(input="x").to_spec("resp_x", LIMITS).template_kwargs == {}


def test_a_service_tier_is_the_job_s_queue_tier():
    assert body(input="x").to_spec("resp_x", LIMITS).priority == "default"
    flex = body(input="x", service_tier="flex")
    assert flex.to_spec("resp_x", LIMITS).priority == "flex" and flex.echo()["service_tier"] == "flex"
    assert body(input="x", service_tier="auto").echo()["service_tier"] == "default"


PATCHER = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /[^\\n]*/'},
}


def test_a_custom_tool_is_a_function_of_its_input_told_its_grammar():
    b = body(
        input=[
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": 'a "b"\n'},
            {
                "type": "custom_tool_call_output",
                "call_id": "call_1",
                "output": "Done.",
                "name": "apply_patch",
            },
        ],
        tools=[WEATHER, PATCHER, {"type": "custom", "name": "note"}],
        tool_choice={"type": "custom", "name": "apply_patch"},
    )
    spec = b.to_spec("resp_x", LIMITS)
    weather, patcher, note = spec.tools
    assert weather.freeform is None and patcher.freeform == PATCHER["format"]
    assert patcher.parameters["properties"] == {"input": {"type": "string"}}
    assert (
        patcher.description.startswith("Edit files.\n\n")
        and PATCHER["format"]["definition"] in patcher.description
    )
    assert note.freeform == {"type": "text"} and "free text" in note.description
    assert spec.tool_choice == NAMED + "apply_patch"
    assert spec.messages[1] == Message(
        "assistant", "", (ToolCall("call_1", "apply_patch", json.dumps({"input": 'a "b"\n'})),)
    )
    assert spec.messages[2] == Message("tool", "Done.", tool_call_id="call_1")
    stored = json.loads(b.job_fields("resp_x")[JobField.INPUT])
    assert [(i["id"], i["type"]) for i in stored[1:]] == [
        ("ctc_x_in1", "custom_tool_call"),
        ("ctco_x_in2", "custom_tool_call_output"),
    ]
    echo = b.echo()
    assert echo["tools"][1] == PATCHER and echo["tool_choice"] == {"type": "custom", "name": "apply_patch"}


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        (
            {"tools": [{**PATCHER, "format": {**PATCHER["format"], "definition": "start: %ignore"}}]},
            "tools[0].format",
        ),
        (
            {
                "tools": [
                    WEATHER,
                    {**PATCHER, "format": {"type": "grammar", "syntax": "regex", "definition": "a(?=b)"}},
                ]
            },
            "tools[1].format",
        ),
        (
            {"tools": [{**PATCHER, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]},
            "tools[0].format.syntax",
        ),
        ({"tools": [{**PATCHER, "strict": True}]}, "tools[0].strict"),
        ({"tools": [WEATHER], "tool_choice": {"type": "custom", "name": "get_weather"}}, "tool_choice.name"),
        (
            {"tools": [PATCHER], "tool_choice": {"type": "function", "name": "apply_patch"}},
            "tool_choice.name",
        ),
    ],
)
def test_a_custom_tool_outside_what_is_enforced_is_refused_by_name(kw, param):
    assert err(input="x", **kw).param == param
