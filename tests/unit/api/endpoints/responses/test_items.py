"""Stored items as the chat messages a worker renders: a reasoning item is the thinking of
the assistant turn after it, and a namespaced call the call of its flattened name."""

from __future__ import annotations

from api.endpoints.responses.items import (
    call_item,
    item_chars,
    message_item,
    output_item,
    reasoning_item,
    to_messages,
)
from contract.jobspec import Message, ToolCall


def test_thinking_goes_with_the_assistant_turn_after_it_calls_and_all():
    items = [
        message_item("m0", "user", "Weather?"),
        reasoning_item("r1", "Need a tool."),
        call_item("f2", "c1", "lookup", "{}", namespace="mcp__weather__"),
        call_item("f3", "c2", "get_time", "{}"),
        output_item("o4", "c1", "Sunny."),
        output_item("o5", "c2", "Noon."),
        reasoning_item("r6", "Both in."),
        message_item("m7", "assistant", "Sunny at noon."),
    ]
    assert to_messages(items) == [
        Message("user", "Weather?"),
        Message(
            "assistant",
            "",
            (ToolCall("c1", "mcp__weather__lookup", "{}"), ToolCall("c2", "get_time", "{}")),
            reasoning="Need a tool.",
        ),
        Message("tool", "Sunny.", tool_call_id="c1"),
        Message("tool", "Noon.", tool_call_id="c2"),
        Message("assistant", "Sunny at noon.", reasoning="Both in."),
    ]


def test_thinking_that_led_to_nothing_is_an_assistant_turn_of_its_own():
    items = [
        message_item("m0", "user", "Hi"),
        reasoning_item("r1", "Hmm."),
        message_item("m2", "user", "Well?"),
    ]
    assert to_messages(items)[1] == Message("assistant", "", reasoning="Hmm.")
    assert to_messages([reasoning_item("r0", "Last.")]) == [Message("assistant", "", reasoning="Last.")]


def test_what_an_item_adds_to_the_prompt_counts_its_thinking_and_namespace():
    assert item_chars(reasoning_item("r", "12345")) == 5
    assert item_chars(call_item("f", "c", "ab", "{}", namespace="ns")) == 6
