"""A message's stream bounded by its end: a cursor above the last number of an ended message
is refused before the stream starts, and one found so only as the job ends ends the stream
with Anthropic's error event."""

from __future__ import annotations

import json

import pytest

from api.endpoints.messages.events import message_events
from api.endpoints.messages.objects import MessageObjects
from api.streaming.cursor import BadCursor
from contract.entries import Delta, Finished, Started

OBJECTS = MessageObjects("msg_abc", 1700000000, "m")
ENDED = [
    ("1-0", Started(worker="w", prompt_tokens=5)),
    ("2-0", Delta(text="Hi", token_ids=(1,))),
    ("3-0", Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=1)),
]


def numbers(raw: bytes) -> list[int]:
    return [int(line[4:]) for line in raw.decode().splitlines() if line.startswith("id: ")]


LAST = numbers(message_events(OBJECTS, None).encode(ENDED).data)[-1]


def test_a_cursor_up_to_the_last_event_is_within_an_ended_message():
    for cursor in (None, "0", str(LAST - 1), str(LAST)):
        message_events(OBJECTS, cursor).check_within(ENDED)
    message_events(OBJECTS, str(LAST + 1)).check_within(ENDED[:2])  # not ended: no bound yet


@pytest.mark.parametrize("cursor", [LAST + 1, 10**9])
def test_a_cursor_above_the_last_event_of_an_ended_message_is_refused(cursor):
    with pytest.raises(BadCursor, match=f"{cursor} is after its last event, {LAST}"):
        message_events(OBJECTS, str(cursor)).check_within(ENDED)


def test_a_stream_whose_message_ends_below_the_cursor_ends_with_an_error_event():
    events = message_events(OBJECTS, str(LAST + 5))
    assert events.encode(ENDED[:2]).data == b""  # running: it waits
    block = events.encode(ENDED[2:]).data.decode()
    assert block.startswith("event: error\ndata: ") and "id: " not in block
    error = json.loads(block.split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert f"after its last event, {LAST}" in error["error"]["message"]


def test_a_stream_from_the_last_event_ends_without_an_error():
    assert message_events(OBJECTS, str(LAST)).encode(ENDED).data == b""
    assert numbers(message_events(OBJECTS, str(LAST - 1)).encode(ENDED).data) == [LAST]
