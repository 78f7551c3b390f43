"""worker.tools.clearing: past its trigger, clear_tool_uses clears the oldest tool results
first, all but the `keep` most recent and those of `exclude_tools`, stops once `clear_at_least`
tokens are cleared (or clears nothing if it cannot clear that many), and clears the calls'
arguments where the edit says so."""

from __future__ import annotations

import dataclasses

from contract.edits.tool_uses import ClearToolUses
from contract.jobspec import JobSpec, Message, ToolCall
from worker.tools.clearing import NO_INPUT, PLACEHOLDER, clear_tool_uses


def words(text: str) -> int:
    return len(text.split())


def job(names=("read",) * 5, result="ten words of a tool result that the model read once", **edit) -> JobSpec:
    messages = [Message("user", "Go.")]
    for n, name in enumerate(names):
        call = ToolCall(f"toolu_{n}", name, '{"path": "a b c"}')
        messages += [
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", f"{n} {result}", tool_call_id=call.id),
        ]
    terms = ClearToolUses(**({"trigger": "tool_uses", "at": 0} | edit)).to_dict()
    return JobSpec(
        id="j", kind="chat", model="m", messages=(*messages, Message("user", "Next?")), clear_tool_uses=terms
    )


def results(spec: JobSpec) -> list[str]:
    return [m.content for m in spec.messages if m.role == "tool"]


def test_the_oldest_results_are_cleared_and_the_kept_ones_left_whole():
    spec = job(keep=1)
    edited, cleared = clear_tool_uses(spec, 999, words)
    assert cleared == 4 and edited.clear_tool_uses is None
    assert results(edited) == [PLACEHOLDER] * 4 + [results(spec)[-1]]
    assert [m.tool_calls for m in edited.messages] == [m.tool_calls for m in spec.messages]  # inputs stay
    assert clear_tool_uses(spec, 999, words) == (edited, cleared)  # the same every time


def test_nothing_is_cleared_below_the_trigger():
    for spec, tokens in ((job(keep=1, at=5), 999), (job(keep=1, trigger="input_tokens", at=1000), 1000)):
        edited, cleared = clear_tool_uses(spec, tokens, words)
        assert cleared == 0 and edited.messages == spec.messages and edited.clear_tool_uses is None
    _, cleared = clear_tool_uses(job(keep=1, trigger="input_tokens", at=1000), 1001, words)
    assert cleared == 4


def test_excluded_tools_are_never_cleared():
    spec = job(names=("read", "memory", "read", "memory", "read"), keep=1, exclude_tools=("memory",))
    edited, cleared = clear_tool_uses(spec, 999, words)
    assert cleared == 2
    assert results(edited) == [PLACEHOLDER, results(spec)[1], PLACEHOLDER, results(spec)[3], results(spec)[4]]


def test_clearing_stops_once_clear_at_least_is_cleared_and_does_nothing_below_it():
    per_result = words("0 ten words of a tool result that the model read once") - words(PLACEHOLDER)
    edited, cleared = clear_tool_uses(job(keep=1, clear_at_least=per_result + 1), 999, words)
    assert cleared == 2 and results(edited)[2:] == results(job())[2:]
    spec = job(keep=1, clear_at_least=4 * per_result + 1)  # more than all four hold
    assert clear_tool_uses(spec, 999, words) == (dataclasses.replace(spec, clear_tool_uses=None), 0)


def test_clear_tool_inputs_clears_the_calls_arguments_too():
    spec = job(names=("read", "write", "read"), keep=0, clear_inputs=("write",))
    edited, cleared = clear_tool_uses(spec, 999, words)
    assert cleared == 3 and results(edited) == [PLACEHOLDER] * 3
    assert [c.arguments for m in edited.messages for c in m.tool_calls] == [
        '{"path": "a b c"}',
        NO_INPUT,
        '{"path": "a b c"}',
    ]
    edited, _ = clear_tool_uses(job(keep=0, clear_inputs=True), 999, words)
    assert {c.arguments for m in edited.messages for c in m.tool_calls} == {NO_INPUT}


def test_a_cleared_result_s_images_go_with_it_and_the_others_keep_their_order():
    from contract.media.images import MARKER

    spec = job(
        names=("shot",) * 3,
        result=f"a screenshot {MARKER} of the page the tool opened, as it looked then",
        keep=1,
    )
    names = ("0" * 64, "1" * 64, "2" * 64)
    spec = dataclasses.replace(spec, images=names)
    edited, cleared = clear_tool_uses(spec, 999, words)
    assert cleared == 2 and edited.images == (names[2],)
    JobSpec.from_dict(edited.to_dict())  # markers and images agree
