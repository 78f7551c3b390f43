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
        (
            {"input": "x", "include": ["message.output_text.logprobs"]},
            "include[0]",
            "reasoning.encrypted_content",
        ),
        (
            {"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": []}]},
            "tools[0].tools",
            "at least 1",
        ),
        (
            {"input": "x", "tools": [{"type": "namespace", "name": "n s", "tools": [WEATHER]}]},
            "tools[0].name",
            "letters, digits",
        ),
        (
            {
                "input": "x",
                "tools": [
                    WEATHER,
                    {"type": "namespace", "name": "get", "tools": [WEATHER]},
                    {**WEATHER, "name": "get__get_weather"},
                ],
            },
            "tools",
            "unique",
        ),
        ({"input": "x", "tools": [{"type": "not_a_tool"}]}, "tools[0].type", "not_a_tool"),
        ({"input": "x", "top_logprobs": 2}, "top_logprobs", "Unsupported parameter"),
        ({"input": "x", "truncation": "auto"}, "truncation", ""),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].image_url",
            "data: URLs",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None, "exactly one"),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]},
            None,
            "user messages",
        ),
        ({"input": [{"type": "reasoning", "summary": [{"type": "nope", "text": "x"}]}]}, None, ""),
        ({"input": [{"type": "reasoning", "encrypted_content": ""}]}, None, ""),
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


NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn a sub-agent.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": False,
            },
        },
        {"type": "function", "name": "wait_agent", "strict": False, "parameters": {"type": "object"}},
    ],
}
CODEX = {
    "input": [
        {
            "type": "message",
            "id": "msg_ed00f5e4-1a6a",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
    ],
    "tools": [WEATHER, NAMESPACE, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a23480-8f36-7060-9188-1ee1fb2ae954",
    "client_metadata": {"turn_id": "01a23480", "x-codex-turn-metadata": '{"session_id":"01a2"}'},
}


def test_codex_s_request_is_taken_namespaces_flattened_and_web_search_left_out():
    b = body(**CODEX)
    b.enforce(LIMITS)
    spec = b.to_spec("resp_x", LIMITS)
    assert [t.name for t in spec.tools] == [
        "get_weather",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__wait_agent",
    ]
    assert spec.tools[1].parameters == NAMESPACE["tools"][0]["parameters"]
    assert spec.max_tokens == LIMITS.max_tokens  # Codex sends no max_output_tokens
    assert b.omitted_tools() == ["web_search"]
    echo = b.echo()
    assert [t["type"] for t in echo["tools"]] == ["function", "namespace"]  # what was offered
    assert [f["name"] for f in echo["tools"][1]["tools"]] == ["spawn_agent", "wait_agent"]
    assert echo["namespaces"]["multi_agent_v1__wait_agent"] == ["multi_agent_v1", "wait_agent"]
    assert echo["include_reasoning"] is True and echo["store"] is False
    assert echo["prompt_cache_key"] == CODEX["prompt_cache_key"]
    assert not body(input="x", include=["file_search_call.results"]).echo()["include_reasoning"]


def test_a_namespaced_call_sent_back_is_the_call_of_its_flattened_name():
    b = body(
        input=[
            {"role": "user", "content": "Spawn one."},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "spawn_agent",
                "namespace": "multi_agent_v1",
                "arguments": '{"message":"hi"}',
            },
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": [{"type": "output_text", "text": "agent "}, {"type": "input_text", "text": "a1"}],
            },
        ],
        tools=[NAMESPACE],
    )
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.messages[1].tool_calls == (
        ToolCall("call_1", "multi_agent_v1__spawn_agent", '{"message":"hi"}'),
    )
    assert spec.messages[2] == Message("tool", "agent a1", tool_call_id="call_1")
    stored = json.loads(b.job_fields("resp_x")[JobField.INPUT])
    assert stored[1]["namespace"] == "multi_agent_v1" and stored[1]["name"] == "spawn_agent"
    assert stored[2]["output"] == "agent a1"


def test_reasoning_sent_back_is_the_thinking_of_the_turn_after_it():
    b = body(
        input=[
            {"role": "user", "content": "Is 17 prime?"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "No divisor."}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Yes."}]},
            {"role": "user", "content": "And 18?"},
        ]
    )
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.messages[1] == Message("assistant", "Yes.", reasoning="No divisor.")
    assert b.prompt_chars()[0] == len("Is 17 prime?No divisor.Yes.And 18?")
    stored = json.loads(b.job_fields("resp_x")[JobField.INPUT])
    assert stored[1]["type"] == "reasoning" and stored[1]["content"][0]["text"] == "No divisor."


def test_a_sealed_reasoning_item_is_read_as_it_was_opened():
    b = body(
        input=[
            {"role": "user", "content": "Weather?"},
            {
                "type": "reasoning",
                "summary": [],
                "encrypted_content": "ts1.x.y",
                "content": [{"type": "reasoning_text", "text": "what the client says"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny."},
        ],
        tools=[WEATHER],
    )
    assert [i for i, _ in b.sealed()] == [1]
    b.sealed()[0][1].open_with("what the server sealed")
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.messages[1].reasoning == "what the server sealed" and spec.messages[1].tool_calls


def test_a_tool_choice_of_auto_or_none_stands_when_every_tool_sent_is_left_out():
    for choice in ("auto", "none"):
        spec = body(input="x", tools=[{"type": "web_search"}], tool_choice=choice).to_spec("resp_x", LIMITS)
        assert spec.tools == () and spec.tool_choice == choice
    assert err(input="x", tools=[{"type": "web_search"}], tool_choice="required").param == "tool_choice"


def test_an_input_image_is_the_marker_at_its_place_and_its_hash_and_is_stored_without_its_bytes():
    import base64
    import hashlib

    from contract.media.images import MARKER, png

    data = png(3, 3)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    parts = [
        {"type": "input_text", "text": "See "},
        {"type": "input_image", "image_url": url, "detail": "low"},
    ]
    b = body(input=[{"role": "user", "content": parts}])
    spec = b.to_spec("resp_x", LIMITS)
    assert spec.messages == (Message("user", f"See {MARKER}"),)
    assert spec.images == (hashlib.sha256(data).hexdigest(),) and spec.low_detail == (0,)
    stored = b.items("resp_x")[0]["content"]
    assert stored[1] == {"type": "input_image", "detail": "low", "file_id": None, "image_url": None}
    forged = [{"type": "input_text", "text": MARKER}, parts[1]]
    assert err(input=[{"role": "user", "content": forged}]).param == "input[0].content[0]"


def test_an_image_file_s_bytes_are_read_as_the_endpoint_gave_them():
    from contract.media.images import png

    b = body(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-abc"}]}])
    [(at, part)] = b.image_parts()
    assert at == "input[0].content[0]"
    part._data = b"not an image"
    with pytest.raises(APIError) as caught:
        b.to_spec("resp_x", LIMITS)
    assert caught.value.param == "input[0].content[0].file_id"
    part._data = png(2, 2)
    assert len(b.to_spec("resp_x", LIMITS).images) == 1
