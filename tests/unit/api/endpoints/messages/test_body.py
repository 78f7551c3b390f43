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
from contract.jobspec import JobSpec, Message, ToolCall
from contract.prefixes import prefixes

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
        ({"messages": [user([{"type": "document", "source": {}}])]}, "document blocks are not supported"),
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


# What Claude Code 2.1 sends (issue 75): each of these was a 400.


def test_a_system_message_mid_conversation_stays_where_it_is():
    job = spec(
        messages=[
            user("Hi."),
            {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},  # noqa: E501
            assistant("Hello."),
            user("Again."),
            {"role": "system", "content": "Be brief."},
        ]
    )  # fmt: skip
    assert job.messages == (
        Message("user", "Hi."),
        Message("system", "# Environment"),
        Message("assistant", "Hello."),
        Message("user", "Again."),
        Message("system", "Be brief."),
    )


def test_a_system_message_cleared_at_the_next_user_message_is_shown_until_then():
    once = {"role": "system", "content": "Only now.", "clear_at": "next_user_message"}
    assert spec(messages=[user("Hi."), once]).messages[-1] == Message("system", "Only now.")
    later = spec(messages=[user("Hi."), once, assistant("Hello."), user("Again.")])
    assert later.messages == (
        Message("user", "Hi."),
        Message("assistant", "Hello."),
        Message("user", "Again."),
    )
    kept = {**once, "clear_at": "never"}
    assert (
        Message("system", "Only now.")
        in spec(messages=[user("Hi."), kept, assistant("a"), user("b")]).messages
    )


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "system", "content": "s"}, assistant("x"), user("y")], "first"),
        ([user("x"), assistant("y"), {"role": "system", "content": "s"}], "prefill"),
        ([user("x"), {"role": "system", "content": [{"type": "image", "source": {}}]}], "not supported here"),
    ],
)
def test_system_messages_keep_the_turn_rules(messages, words):
    assert words in refusal(messages=messages).message


def test_thinking_shown_as_updates_streams_as_summarized_thinking():
    updates = spec(
        max_tokens=64,
        messages=[user("x")],
        thinking={"type": "enabled", "budget_tokens": 32, "display": "updates"},
    )
    summarized = spec(
        max_tokens=64,
        messages=[user("x")],
        thinking={"type": "enabled", "budget_tokens": 32, "display": "summarized"},
    )
    assert updates == summarized
    request = parse(
        MessagesRequest,
        json.dumps(
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [user("x")],
                "thinking": {"type": "adaptive", "display": "updates"},
            }
        ).encode(),
    )
    assert request.job_fields("msg_x") == {}  # thinking blocks keep their text


def test_clearing_thinking_changes_nothing():
    for keep in ("all", {"type": "thinking_turns", "value": 1}, None):
        edit = {"type": "clear_thinking_20251015", **({"keep": keep} if keep else {})}
        job = spec(messages=[user("x")], context_management={"edits": [edit]})
        assert job == spec(messages=[user("x")])


def test_clearing_tool_uses_travels_in_the_job_with_anthropics_defaults():
    bare = {"type": "clear_tool_uses_20250919"}
    job = spec(messages=[user("x")], context_management={"edits": [bare]})
    assert job.clear_tool_uses == {
        "trigger": "input_tokens",
        "at": 100_000,
        "keep": 3,
        "clear_at_least": 0,
        "exclude_tools": [],
        "clear_inputs": False,
    }
    edit = {
        **bare,
        "trigger": {"type": "tool_uses", "value": 4},
        "keep": {"type": "tool_uses", "value": 1},
        "clear_at_least": {"type": "input_tokens", "value": 500},
        "exclude_tools": ["memory"],
        "clear_tool_inputs": ["weather"],
    }
    job = spec(messages=[user("x")], context_management={"edits": [edit]})
    assert job.clear_tool_uses == {
        "trigger": "tool_uses",
        "at": 4,
        "keep": 1,
        "clear_at_least": 500,
        "exclude_tools": ["memory"],
        "clear_inputs": ["weather"],
    }
    assert JobSpec.from_dict(job.to_dict()) == job
    assert "clear_tool_uses" not in spec(messages=[user("x")]).to_dict()  # an earlier worker takes it


@pytest.mark.parametrize(
    ("edit", "param"),
    [  # each field's value of the wrong kind
        ({"keep": {"type": "input_tokens", "value": 1}}, "context_management.edits[0].keep.type"),
        ({"trigger": {"type": "input_tokens", "value": -1}}, "context_management.edits[0].trigger.value"),
        ({"clear_at_least": {"type": "tool_uses", "value": 1}}, "context_management.edits[0].clear_at_least.type"),  # noqa: E501
        ({"exclude_tools": "weather"}, "context_management.edits[0].exclude_tools"),
        ({"clear_tool_inputs": "yes"}, "context_management.edits[0].clear_tool_inputs"),
        ({"keep_all": True}, "context_management.edits[0].keep_all"),
    ],
)  # fmt: skip
def test_a_bad_clear_tool_uses_edit_is_a_400_naming_its_field(edit, param):
    edits = [{"type": "clear_tool_uses_20250919", **edit}]
    refused = refusal(messages=[user("x")], context_management={"edits": edits})
    assert (refused.status, refused.param) == (400, param)


def test_two_clear_tool_uses_edits_are_a_400():
    edit = {"type": "clear_tool_uses_20250919"}
    refused = refusal(messages=[user("x")], context_management={"edits": [edit, edit]})
    assert refused.status == 400 and refused.param == "context_management.edits[1]"


def test_deferred_tools_are_offered_like_the_others_and_tool_search_is_left_out():
    deferred = {**TOOL, "defer_loading": True}
    search = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
    job = spec(tools=[search, deferred, {**TOOL, "name": "other"}], messages=[user("x")])
    assert [t.name for t in job.tools] == ["weather", "other"]
    assert job.tools[0] == spec(tools=[TOOL], messages=[user("x")]).tools[0]


def test_a_tool_use_block_dumped_by_the_sdk_is_taken_back():
    for caller in ({"type": "direct"}, {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}):
        call = {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "weather",
            "input": {},
            "caller": caller,
            "toolset_name": None,
        }
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sun"}
        job = spec(tools=[TOOL], messages=[user("x"), assistant([call]), user([result])])
        assert job.messages[1].tool_calls == (ToolCall("toolu_1", "weather", "{}"),)


def test_what_a_grammar_cannot_enforce_is_dropped_from_a_non_strict_tool_and_refused_in_a_strict_one():
    schema = {
        "type": "object",
        "properties": {
            "to": {"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
            "script": {"type": "string", "maxLength": 5000},
        },
        "required": ["to"],
    }
    job = spec(tools=[{"name": "send", "input_schema": schema}], messages=[user("x")])
    assert job.tools[0].parameters["properties"] == {"to": {"type": "string"}, "script": {"type": "string"}}
    refused = refusal(tools=[{"name": "send", "input_schema": schema, "strict": True}], messages=[user("x")])
    assert refused.param == "tools[0].input_schema" and "allOf" in refused.message


def test_claude_codes_attribution_block_does_not_change_the_prompt_from_request_to_request():
    def job(cch: str):
        header = f"x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch={cch};"
        system = [{"type": "text", "text": header}, {"type": "text", "text": "Be brief."}]
        return spec(system=system, messages=[user("x")])

    first, second = job("3f2a1"), job("9c0d7")
    assert first == second and "cch=" in first.messages[0].content
    assert prefixes(first) == prefixes(second)


def test_a_max_tokens_above_the_servers_limit_is_clamped_to_it():
    assert spec(max_tokens=32000, messages=[user("x")]).max_tokens == LIMITS.max_tokens
    thinking = {"type": "enabled", "budget_tokens": 31999}
    assert spec(max_tokens=32000, messages=[user("x")], thinking=thinking).max_tokens == LIMITS.max_tokens


def test_a_tool_search_results_references_name_tools_already_offered():
    """Claude Code's ToolSearch answers with `tool_reference` blocks: every tool is rendered in
    the prompt already, so a reference is the found tool's name, and must name one."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    found = {"type": "tool_reference", "tool_name": "other"}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [found, found],
        "toolset_name": None,
    }
    turns = [user("x"), assistant([call]), user([result])]
    job = spec(tools=[TOOL, {**TOOL, "name": "other", "defer_loading": True}], messages=turns)
    assert job.messages[-1] == Message("tool", "Tool found: other\nTool found: other", tool_call_id="toolu_1")
    refused = refusal(tools=[TOOL], messages=turns)
    assert refused.param == "messages[2].content[0]" and "other" in refused.message


def _image_block(data: bytes) -> dict:
    import base64

    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
    }


def test_a_user_image_block_becomes_the_marker_at_its_place_and_its_hash():
    import hashlib

    from contract.media.images import MARKER, png

    data = png(3, 3)
    job = spec(max_tokens=8, messages=[user([{"type": "text", "text": "See "}, _image_block(data)])])
    assert job.messages[-1].content == f"See {MARKER}"
    assert job.images == (hashlib.sha256(data).hexdigest(),)
    JobSpec.from_dict(job.to_dict())


def test_unfetched_url_and_file_sources_and_forged_markers_are_refused():
    from contract.media.images import MARKER, png

    url = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}  # IMAGE_URL_HOSTS unset
    found = refusal(max_tokens=8, messages=[user([url])])
    assert found.param == "messages[0].content[0].source.url" and "IMAGE_URL_HOSTS" in found.message
    file = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    assert refusal(max_tokens=8, messages=[user([file])]).param == "messages[0].content[0].source"
    forged = [{"type": "text", "text": MARKER}, _image_block(png(2, 2))]
    assert refusal(max_tokens=8, messages=[user(forged)]).param == "messages"
    assert spec(max_tokens=8, messages=[user(MARKER)]).images == ()


def test_a_tool_result_s_image_is_read_in_its_tool_message_before_the_turn_s_own():
    import hashlib

    from contract.media.images import MARKER, png

    shot, own = png(3, 3, seed=1), png(3, 3, seed=2)
    call = {"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "The page: "}, _image_block(shot)],
    }
    turns = [user("Look."), assistant([call]), user([_image_block(own), result])]
    job = spec(max_tokens=8, tools=[TOOL | {"name": "shot"}], messages=turns)
    tool = next(m for m in job.messages if m.role == "tool")
    assert tool.content == f"The page: {MARKER}" and job.messages[-1].content == MARKER
    assert job.images == tuple(hashlib.sha256(d).hexdigest() for d in (shot, own))
    bad = {**result, "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}
    refused = refusal(max_tokens=8, tools=[TOOL | {"name": "shot"}], messages=[*turns[:2], user([bad])])
    assert refused.param == "messages[2].content[0].content[0].source.url"
