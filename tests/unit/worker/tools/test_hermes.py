"""worker.tools.hermes's reply: content and `<tool_call>` calls, however the text is cut."""

import pytest

from tests.unit.worker.reading import CID, calls, run
from worker.text.replies import call_id
from worker.tools.hermes import HermesReply


@pytest.mark.parametrize("seed", range(5))
def test_hermes_content_then_calls(seed):
    text = (
        "Let me check <tool. <tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> done'
    )
    reply = HermesReply(CID)
    out = run(reply, text, seed)
    assert out.content == "Let me check <tool. \n done"
    assert calls(out) == [
        {"id": call_id(CID, 0), "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"id": call_id(CID, 1), "name": "get_time", "arguments": "{}"},
    ]
    assert reply.calls == 2


def test_hermes_text_that_is_not_a_call_stays_content():
    out = run(HermesReply(CID), "a <tool_call> not json </tool_call> b")
    assert out.content == "a <tool_call> not json </tool_call> b" and not out.calls


def test_hermes_holds_back_only_what_may_open_a_call():
    reply = HermesReply(CID)
    assert reply.feed("hi <tool").content == "hi "
    assert reply.feed("box").content == "<toolbox"
    assert reply.end().content == ""


def test_an_assistants_sent_back_thinking_reaches_the_template_under_its_name():
    from contract.jobspec import JobSpec, Message
    from worker.tools.harmony import HarmonyTools
    from worker.tools.hermes import HermesTools

    spec = JobSpec(
        id="chatcmpl-x",
        kind="chat",
        model="m",
        messages=(
            Message("user", "hi"),
            Message("assistant", "Hello.", reasoning="They greet."),
            Message("user", "?"),
        ),
    )
    hermes, _ = HermesTools().messages(spec)
    harmony, _ = HarmonyTools().messages(spec)
    assert hermes[1]["reasoning_content"] == "They greet." and harmony[1]["thinking"] == "They greet."
    assert "reasoning_content" not in hermes[0]
