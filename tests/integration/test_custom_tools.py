"""Custom tools on the Responses API as Codex CLI sends them: a freeform `apply_patch` tool
whose input is constrained by Codex's own Lark grammar, forced with
`tool_choice: {"type": "custom"}` at temperature 0. The real model writes a
`custom_tool_call` whose input the grammar takes, streamed as OpenAI streams it and parsed by
the official SDK in strict mode; the call and its `custom_tool_call_output` go back as the
next turn's history. A grammar outside the supported subset is a 400 naming the tool's
format, and nothing is queued."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import regex

from contract import keys
from devstack.sse_contract import check_responses_stream
from tests.integration.conftest import MODEL, strict_sdk

pytestmark = pytest.mark.integration

# codex-rs/core/src/tools/handlers/tool_apply_patch.lark (openai/codex), verbatim
GRAMMAR = (Path(__file__).parents[1] / "unit" / "contract" / "freeform" / "apply_patch.lark").read_text()
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": (
        "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not wrap the patch in JSON."
    ),
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
# The same language as a Python regex (the grammar is regular): an oracle apart from the compiler
_LINE = r"[^\n]"
_HUNK = (
    rf"\*\*\* Add File: {_LINE}+\n(\+{_LINE}*\n)+"
    rf"|\*\*\* Delete File: {_LINE}+\n"
    rf"|\*\*\* Update File: {_LINE}+\n(\*\*\* Move to: {_LINE}+\n)?"
    rf"(((@@|@@ {_LINE}+)\n|[-+ ]{_LINE}*\n)+(\*\*\* End of File\n)?)?"
)
PATCH_LANGUAGE = re.compile(rf"\*\*\* Begin Patch\n({_HUNK})+\*\*\* End Patch\n?")
PATCH_PREFIXES = regex.compile(PATCH_LANGUAGE.pattern)  # with partial matches
ASK = "Create the file hello.txt containing the line Hello world."
FORCED = {"type": "custom", "name": "apply_patch"}


@pytest.fixture
def sdk(stack):
    with strict_sdk(stack.base) as c:
        yield c


def _spec(stack, rid: str) -> dict:
    return json.loads(stack.streams.hget(keys.job(rid), keys.JobField.SPEC))


def test_a_forced_custom_call_streams_an_input_its_grammar_takes(stack, sdk):
    """SmolLM2 keeps calling (parallel calls, as Codex allows them) until max_output_tokens:
    every call it finished is a patch of the grammar's language, and one cut off by the limit
    is the start of one. Which of the two its greedy answer ends in is a near tie that the
    step size flips (docs/benchmarks.md, the host tier's section)."""
    events = list(
        sdk.responses.create(
            model=MODEL,
            input=ASK,
            tools=[APPLY_PATCH],
            tool_choice=FORCED,
            temperature=0,
            max_output_tokens=400,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[-1] in ("response.completed", "response.incomplete") and "function_call" not in str(kinds)
    final = events[-1].response
    calls = [item for item in final.output if item.type == "custom_tool_call"]
    assert calls and len(calls) == len(final.output), final.output
    assert all(item.status == "completed" for item in calls[:-1]), "only the last call may be cut off"
    if calls[-1].status != "completed":  # a greedy loop until the limit ("Update File: ..." again)
        assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    for call in calls:
        assert call.name == "apply_patch" and call.call_id.startswith("call_") and call.id.startswith("ctc_")
        # a call cut off is still the start of a patch the grammar takes
        assert PATCH_PREFIXES.fullmatch(call.input, partial=call.status != "completed"), call.input
        deltas = [e.delta for e in events if e.type.endswith("input.delta") and e.item_id == call.id]
        ends = [e.input for e in events if e.type.endswith("input.done") and e.item_id == call.id]
        assert "".join(deltas) == call.input and ends == [call.input]
    assert final.tools[0].type == "custom" and final.tool_choice.type == "custom"

    call = calls[0]
    again = sdk.responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."}],
        tools=[APPLY_PATCH],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert again.status in ("completed", "incomplete")
    messages = _spec(stack, again.id)["messages"]
    assert messages[1]["tool_calls"][0] == {
        "id": call.call_id,
        "name": "apply_patch",
        "arguments": json.dumps({"input": call.input}, ensure_ascii=False),
    }
    assert messages[-1] == {"role": "tool", "content": "Done.", "tool_call_id": call.call_id}


def test_a_regex_tool_s_call_ends_and_the_sdk_helper_parses_it(sdk):
    tool = {"type": "custom", "name": "answer", "format": {"type": "grammar", "syntax": "regex"}}
    tool["format"]["definition"] = "(yes|no)"
    with sdk.responses.stream(
        model=MODEL,
        input="Is Paris in France?",
        tools=[tool],
        tool_choice={"type": "custom", "name": "answer"},
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=64,
    ) as stream:
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "custom_tool_call" and call.input in ("yes", "no") and call.status == "completed"


def test_codex_history_sends_the_call_and_its_output_back(stack, sdk):
    """Codex keeps no server state (`store: false`): each turn sends the whole history."""
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+Hello world\n*** End Patch\n"
    r = sdk.responses.create(
        model=MODEL,
        store=False,
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": patch},
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success."},
        ],
        tools=[APPLY_PATCH],
        max_output_tokens=8,
    )
    assert r.status in ("completed", "incomplete")


def test_a_raw_stream_keeps_the_responses_contract(stack):
    body = {"model": MODEL, "input": ASK, "tools": [APPLY_PATCH], "tool_choice": "required", "temperature": 0}
    body |= {"parallel_tool_calls": False}
    raw = httpx.post(
        stack.base + "/v1/responses", json={**body, "stream": True, "max_output_tokens": 400}, timeout=120
    )
    parsed = check_responses_stream(raw.content)
    added = [e for e in parsed.events if e["type"] == "response.output_item.added"]
    assert added[0]["item"] == {
        "id": added[0]["item"]["id"],
        "type": "custom_tool_call",
        "status": "in_progress",
        "call_id": added[0]["item"]["call_id"],
        "name": "apply_patch",
        "input": "",
    }
    assert added[0]["item"]["id"].startswith("ctc_")
    done = next(e for e in parsed.events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == parsed.terminal["response"]["output"][0]["input"]


@pytest.mark.parametrize(
    ("tools", "choice", "param", "words"),
    [
        (
            [{**APPLY_PATCH, "format": {**APPLY_PATCH["format"], "definition": GRAMMAR + '%ignore " "\n'}}],
            None,
            "tools[0].format",
            "%ignore",
        ),
        (
            [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "(a"}}],
            None,
            "tools[0].format",
            "')'",
        ),
        (
            [
                {
                    **APPLY_PATCH,
                    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: start "a" | "a"'},
                }
            ],
            None,
            "tools[0].format",
            "left-recursive",
        ),
        (
            [
                {
                    **APPLY_PATCH,
                    "format": {"type": "grammar", "syntax": "regex", "definition": "(a{999}){999}" * 11},
                }
            ],
            None,
            "tools[0].format",
            "at most",
        ),
        ([APPLY_PATCH], {"type": "custom", "name": "nope"}, "tool_choice.name", "nope"),
        ([APPLY_PATCH], {"type": "function", "name": "apply_patch"}, "tool_choice.name", "apply_patch"),
    ],
)
def test_a_grammar_outside_the_subset_is_refused_naming_the_tool(stack, tools, choice, param, words):
    before = stack.queued(), stack.job_keys()
    body = {"model": MODEL, "input": ASK, "tools": tools, **({"tool_choice": choice} if choice else {})}
    r = httpx.post(stack.base + "/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert (stack.queued(), stack.job_keys()) == before
