"""The thinking part of a reply, apart from the answer, whatever the pieces."""

from __future__ import annotations

import pytest

from tests.unit.worker.reading import CID, calls, run
from worker.text.replies import PlainReply
from worker.text.thinking import TAIL_TOKENS, Thinking, generation_prompt, grammar_after, opened_by
from worker.tools.hermes import HermesReply

SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_block_the_prompt_opened_is_thinking_and_the_answer_follows_it(seed):
    out = run(Thinking(PlainReply(), opened=True), "Let me see: 2 < 3.\n</think>\n\nYes.", seed)
    assert (out.reasoning, out.content) == ("Let me see: 2 < 3.\n", "Yes.")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_block_the_model_opens_after_whitespace(seed):
    out = run(Thinking(PlainReply(), opened=False), "\n<think>\nhmm</thi</think>Sure.", seed)
    assert (out.reasoning, out.content) == ("\nhmm</thi", "Sure.")


@pytest.mark.parametrize("seed", SEEDS)
def test_without_a_block_the_text_is_the_answer_as_it_came(seed):
    for text in ("  Hello <think> there", "<thinking>", " <t", ""):
        out = run(Thinking(PlainReply(), opened=False), text, seed)
        assert (out.reasoning, out.content) == ("", text)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_block_never_closed_is_all_thinking(seed):
    thinking = Thinking(PlainReply(), opened=True)
    out = run(thinking, "still going </th", seed)
    assert (out.reasoning, out.content) == ("still going </th", "")
    assert thinking.thought and thinking.closed_at is None


def test_the_answer_starts_after_the_block_and_its_whitespace():
    thinking = Thinking(PlainReply(), opened=True)
    text = "ab</think> \n Yes"
    run(thinking, text)
    assert thinking.closed_at == text.index("Yes")
    plain = Thinking(PlainReply(), opened=False)
    run(plain, "no block")
    assert not plain.thought and plain.closed_at is None


@pytest.mark.parametrize("seed", SEEDS)
def test_tool_calls_are_read_from_the_answer_only(seed):
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    text = "<tool_call>not this</tool_call></think>\n" + call
    out = run(Thinking(HermesReply(CID), opened=True), text, seed)
    assert out.reasoning == "<tool_call>not this</tool_call>"
    assert [c["name"] for c in calls(out)] == ["f"] and out.content == ""


def test_a_continuation_fed_the_earlier_text_at_once_goes_on_where_it_was():
    """What an attempt sent before its worker died (held text not sent), then what the next
    one sends having read the same text: the whole run's split."""
    text = "one </think> two"
    whole = run(Thinking(PlainReply(), opened=True), text)
    for cut in range(len(text) + 1):
        sent = Thinking(PlainReply(), opened=True).feed(text[:cut])
        resumed = Thinking(PlainReply(), opened=True)
        resumed.feed(text[:cut])
        rest = run(resumed, text[cut:])
        assert sent.reasoning + rest.reasoning == whole.reasoning
        assert sent.content + rest.content == whole.content
        assert resumed.closed_at == text.index("two")


def test_the_prompt_says_whether_it_opened_a_block():
    assert opened_by("<|im_start|>assistant\n<think>\n")
    assert not opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    assert not opened_by("<|im_start|>assistant\n")


def test_the_generation_prompt_is_what_follows_the_last_turn_mark():
    marks = frozenset({1, 2})  # <|im_start|>, <|im_end|>
    user_ends_in_a_tag = [1, 50, 51, 60, 2, 1, 70]  # ... "<think>" <|im_end|> <|im_start|> assistant
    assert generation_prompt(user_ends_in_a_tag, marks) == [70]
    assert generation_prompt([5, 6, 7], marks) == [5, 6, 7]  # no mark: the last tokens
    assert len(generation_prompt(list(range(100, 200)), marks)) == TAIL_TOKENS


def test_a_grammar_after_the_thinking_starts_at_the_close():
    answer = 'root ::= "{" ws "}"\nws ::= " "?\n'
    assert grammar_after(answer) == (
        'root ::= [^<]* "</think>" [ \\t\\n]* thought-answer\nthought-answer ::= "{" ws "}"\nws ::= " "?\n'
    )
    with pytest.raises(ValueError):
        grammar_after('ws ::= " "?\nroot ::= ws\n')
