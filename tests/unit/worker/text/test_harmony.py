"""gpt-oss's harmony messages: thinking, answer and tool calls apart, whatever the pieces."""

from __future__ import annotations

import pytest

from tests.unit.worker.reading import CID, calls, run
from worker.text.harmony import CLOSING, Harmony, opened_channel
from worker.text.replies import PlainReply, call_id

SEEDS = range(8)
# what llama.cpp renders of a gpt-oss answer: <|end|> is nothing, <|return|> ends it unseen
ANSWER = (
    "<|channel|>analysis<|message|>User greets. 2 < 3 | fine."
    "<|start|>assistant<|channel|>final<|message|>Hello!"
)


@pytest.mark.parametrize("seed", SEEDS)
def test_analysis_is_thinking_and_final_is_the_answer(seed):
    harmony = Harmony(PlainReply(), CID)
    out = run(harmony, ANSWER, seed)
    assert (out.reasoning, out.content, out.calls) == ("User greets. 2 < 3 | fine.", "Hello!", [])
    ((start, end),) = harmony.reasoning_spans
    assert start == 0 and ANSWER[end:].startswith("<|start|>assistant") and not harmony.in_thinking


@pytest.mark.parametrize("seed", SEEDS)
def test_an_end_marker_rendered_as_text_ends_the_message_too(seed):
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi <3"
    harmony = Harmony(PlainReply(), CID)
    out = run(harmony, text, seed)
    assert (out.reasoning, out.content) == ("Think.", "Hi <3")
    assert text[harmony.reasoning_spans[0][1] :].startswith("<|end|>")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_message_the_prompt_opened_goes_on_from_its_body(seed):
    harmony = Harmony(PlainReply(), CID, opened="analysis")
    out = run(harmony, "hmm <|start" + "|>assistant<|channel|>final<|message|>Yes.", seed)
    assert (out.reasoning, out.content) == ("hmm ", "Yes.")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_call_on_the_commentary_channel_is_a_tool_call(seed):
    text = (
        "<|channel|>analysis<|message|>Need weather.<|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    )  # then <|call|>, which ends generation unseen
    harmony = Harmony(PlainReply(), CID, tools=frozenset({"get_weather"}))
    out = run(harmony, text, seed)
    assert out.reasoning == "Need weather." and out.content == ""
    assert calls(out) == [{"id": call_id(CID, 0), "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert harmony.calls == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_the_recipient_may_come_before_the_channel(seed):
    text = '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}'
    out = run(Harmony(PlainReply(), CID, tools=frozenset({"lookup"})), text, seed)
    assert calls(out) == [{"id": call_id(CID, 0), "name": "lookup", "arguments": '{"q": 1}'}]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_preamble_to_the_user_is_content(seed):
    text = "<|channel|>commentary<|message|>Checking.<|start|>assistant<|channel|>final<|message|>Done."
    harmony = Harmony(PlainReply(), CID)
    out = run(harmony, text, seed)
    assert (out.reasoning, out.content) == ("", "Checking.Done.") and not harmony.reasoning_spans


@pytest.mark.parametrize("seed", SEEDS)
def test_text_that_is_not_harmony_is_the_answer_as_it_came(seed):
    for text in ("Hello there!\nHow are you?", "x" * 300, "<|chan"):
        out = run(Harmony(PlainReply(), CID), text, seed)
        assert (out.reasoning, out.content) == ("", text)


@pytest.mark.parametrize("seed", SEEDS)
def test_thinking_never_closed_is_all_thinking(seed):
    harmony = Harmony(PlainReply(), CID, opened="analysis")
    out = run(harmony, "still going <|sta", seed)
    assert (out.reasoning, out.content) == ("still going <|sta", "")
    assert harmony.reasoning_spans == [(0, None)]
    still = Harmony(PlainReply(), CID, opened="analysis")
    still.feed("going")
    assert still.in_thinking  # a thinking budget may close it


def test_a_continuation_fed_the_earlier_text_goes_on_where_it_was():
    first = Harmony(PlainReply(), CID)
    said = first.feed(ANSWER[:40])
    second = Harmony(PlainReply(), CID)
    second.feed(ANSWER[:40])  # what earlier attempts generated: read, not said again
    rest = second.feed(ANSWER[40:]).add(second.end())
    whole = run(Harmony(PlainReply(), CID), ANSWER)
    assert said.reasoning + rest.reasoning == whole.reasoning and rest.content == whole.content


@pytest.mark.parametrize("end", ["<|end|>", ""])  # as text, or as nothing (by llama.cpp's version)
def test_a_budget_closes_the_analysis_with_the_final_header(end):
    harmony = Harmony(PlainReply(), CID, opened="analysis")
    out = run(harmony, "thinking" + CLOSING.replace("<|end|>", end) + "Answer.")
    assert (out.reasoning, out.content) == ("thinking", "Answer.")


def test_the_prompt_says_which_channel_it_left_open():
    assert opened_channel("<|end|><|start|>assistant") is None
    assert opened_channel("<|start|>assistant<|channel|>analysis<|message|>") == "analysis"
    assert opened_channel("<|start|>user<|message|>hi<|end|><|start|>assistant") is None


@pytest.mark.parametrize("seed", SEEDS)
def test_a_stray_channel_before_the_real_one_is_passed_over(seed):
    """gpt-oss-20b sometimes writes `<|channel|>commentary` before its real channel."""
    text = "<|channel|>commentary<|channel|>analysis<|message|>t<|end|>"
    text += "<|start|>assistant<|channel|>final<|message|>F"
    out = run(Harmony(PlainReply(), CID), text, seed)
    assert (out.reasoning, out.content) == ("t", "F")


@pytest.mark.parametrize("seed", SEEDS)
def test_every_analysis_message_is_thinking_and_counted_where_it_lies(seed):
    first = "<|channel|>final<|message|>Hi<|end|>"
    second = "<|start|>assistant<|channel|>analysis<|message|>hmm<|end|>"
    text = first + second + "<|start|>assistant<|channel|>final<|message|> there"
    harmony = Harmony(PlainReply(), CID)
    out = run(harmony, text, seed)
    assert (out.reasoning, out.content) == ("hmm", "Hi there")
    assert harmony.reasoning_spans == [(len(first), len(first + second) - len("<|end|>"))]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_call_to_a_tool_not_offered_is_the_models_own_business(seed):
    text = '<|channel|>commentary to=browser.search<|message|>{"q": "x"}<|end|>'
    text += "<|start|>assistant<|channel|>final<|message|>Ok"
    harmony = Harmony(PlainReply(), CID, tools=frozenset({"get_weather"}))
    out = run(harmony, text, seed)
    assert (out.reasoning, out.content, out.calls, harmony.calls) == ('{"q": "x"}', "Ok", [], 0)
