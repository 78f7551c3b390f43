"""A Message and its events from a job's entries: the same entries always give the same
numbered events (a resume gets exactly the rest), each in the shape the anthropic SDK's types
describe, and every ending has its stop_reason or its error."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent
from pydantic import TypeAdapter

from api.endpoints.messages.events import PING, message_events
from api.endpoints.messages.objects import MessageObjects, signature
from api.streaming.cursor import BadCursor
from contract import errors
from contract.entries import CallPart, Delta, Finished, Started

OBJECTS = MessageObjects("msg_abc", 1700000000, "m")
EVENT = TypeAdapter(RawMessageStreamEvent)


def rows(*entries) -> list:
    return [(f"17000000{n:05d}-0", e) for n, e in enumerate(entries, start=1)]


def parse(raw: bytes) -> list[tuple[str | None, dict]]:
    """(id, data) of every event, each checked against the SDK's types and its `event:` line."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = json.loads(fields["data"])
        assert fields["event"] == data["type"]
        if data["type"] != "error":
            EVENT.validate_python(data)
        out.append((fields.get("id"), data))
    return out


def stream(entries: list, after: str | None = None, objects: MessageObjects = OBJECTS) -> bytes:
    events = message_events(objects, after)
    out = events.opening()
    for row in entries:
        out += events.encode([row]).data
    return out + events.done()


THOUGHT_AND_CALL = rows(
    Started(worker="w", prompt_tokens=9),
    Delta(text="", token_ids=(1,), reasoning="Let me "),
    Delta(text="", token_ids=(2,), reasoning="see."),
    Delta(text="Sure.", token_ids=(3,)),
    Delta(text="", token_ids=(4,), calls=(CallPart(0, '{"city": ', "toolu_1", "weather"),)),
    Started(worker="w2", prompt_tokens=9),  # a crash: the next attempt goes on
    Delta(text="", token_ids=(5,), calls=(CallPart(0, '"Paris"}'),)),
    Finished(
        finish_reason="tool_calls", prompt_tokens=9, completion_tokens=5, cached_tokens=4, reasoning_tokens=2
    ),
)


def test_a_thinking_text_and_tool_use_message_streams_its_blocks_in_order():
    events = parse(stream(THOUGHT_AND_CALL))
    kinds = [
        (d["type"], d.get("delta", {}).get("type") or d.get("content_block", {}).get("type"))
        for _, d in events
    ]
    assert kinds == [
        ("message_start", None),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),  # the signature before the block ends
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert [eid for eid, _ in events] == [str(n) for n in range(len(events))]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 9
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert end["usage"]["input_tokens"] == 5 and end["usage"]["cache_read_input_tokens"] == 4
    assert end["usage"]["output_tokens_details"] == {"thinking_tokens": 2}

    answer = OBJECTS.answer(THOUGHT_AND_CALL)
    assert answer is not None and answer.status == 200
    message = Message.model_validate(answer.body)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature == signature("Let me see.")  # type: ignore[union-attr]
    assert message.content[2].input == {"city": "Paris"}  # type: ignore[union-attr]


@pytest.mark.parametrize("after", range(-1, 15))
def test_a_resume_after_any_event_gets_exactly_the_rest(after):
    whole = parse(stream(THOUGHT_AND_CALL))
    rest = parse(stream(THOUGHT_AND_CALL, None if after < 0 else str(after)))
    assert rest == whole[after + 1 :]


def test_thinking_not_shown_is_a_signed_block_without_text():
    hidden = MessageObjects("msg_abc", 1700000000, "m", shows_thinking=False)
    events = parse(stream(THOUGHT_AND_CALL, objects=hidden))
    assert not any(d.get("delta", {}).get("type") == "thinking_delta" for _, d in events)
    answer = hidden.answer(THOUGHT_AND_CALL)
    assert answer is not None and answer.body["content"][0] == {
        "type": "thinking",
        "thinking": "",
        "signature": signature("Let me see."),
    }


@pytest.mark.parametrize(
    ("finished", "reason", "sequence"),
    [
        (Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=2), "end_turn", None),
        (
            Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=2, stop_sequence="\nQ:"),
            "stop_sequence",
            "\nQ:",
        ),
        (Finished(finish_reason="length", prompt_tokens=3, completion_tokens=2), "max_tokens", None),
        (Finished(finish_reason="cancelled", prompt_tokens=3, completion_tokens=1), "end_turn", None),
    ],
)
def test_every_ending_has_its_stop_reason(finished, reason, sequence):
    entries = rows(Started(worker="w", prompt_tokens=3), Delta(text="Hi", token_ids=(1, 2)), finished)
    answer = OBJECTS.answer(entries)
    assert answer is not None and (answer.body["stop_reason"], answer.body["stop_sequence"]) == (
        reason,
        sequence,
    )


def test_a_failure_is_anthropics_error_event_and_status():
    entries = rows(
        Started(worker="w", prompt_tokens=3), Delta(text="Hi", token_ids=(1,)), errors.WORKER_LOST.entry()
    )
    events = parse(stream(entries))
    assert events[-1][1] == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": errors.WORKER_LOST.message},
    }
    assert events[-1][0] is not None  # a numbered event: a resume after it gets nothing more
    answer = OBJECTS.answer(entries)
    assert answer is not None and answer.status == 529 and answer.body["error"]["type"] == "overloaded_error"


def test_keepalives_are_pings_and_a_stream_error_has_no_id():
    events = message_events(OBJECTS, None)
    assert events.keepalive() == PING
    assert parse(events.error(errors.UNAVAILABLE)) == [
        (
            None,
            {"type": "error", "error": {"type": "overloaded_error", "message": errors.UNAVAILABLE.message}},
        )
    ]


@pytest.mark.parametrize("cursor", ["x", "-1", "1.5", "9" * 12, "٣"])
def test_a_cursor_that_is_not_an_event_number_is_refused(cursor):
    with pytest.raises(BadCursor):
        message_events(OBJECTS, cursor)


def test_what_clear_tool_uses_cleared_is_in_the_message_and_its_message_delta():
    """As the SDK's beta types put it: the Message's and the message_delta's context_management."""
    cleared = rows(
        Started(worker="w", prompt_tokens=90, cleared_tool_uses=4, cleared_input_tokens=312),
        Delta(text="Done.", token_ids=(1,)),
        Started(worker="w2", prompt_tokens=90, cleared_tool_uses=4, cleared_input_tokens=312),  # a resume
        Finished(finish_reason="stop", prompt_tokens=90, completion_tokens=1),
    )
    applied = {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 4, "cleared_input_tokens": 312}
    answer = OBJECTS.answer(cleared)
    assert answer is not None
    message = BetaMessage.model_validate(answer.body)
    assert message.context_management is not None
    assert [e.model_dump() for e in message.context_management.applied_edits] == [applied]
    delta = next(d for _, d in parse(stream(cleared)) if d["type"] == "message_delta")
    event = TypeAdapter(BetaRawMessageStreamEvent).validate_python(delta)
    assert [e.model_dump() for e in event.context_management.applied_edits] == [applied]  # type: ignore[union-attr]
    plain = OBJECTS.answer(THOUGHT_AND_CALL)
    assert plain is not None and "context_management" not in plain.body  # nothing cleared, nothing said
