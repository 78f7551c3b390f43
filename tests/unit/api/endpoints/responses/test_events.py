"""A response's stream bounded by its end: a cursor above the last number of an ended response
is refused before the stream starts, and one found so only as the job ends ends the stream
with an `invalid_cursor` error event."""

from __future__ import annotations

import json

import pytest

from api.endpoints.responses.events import response_events
from api.endpoints.responses.objects import ResponseObjects
from api.streaming.cursor import BadCursor
from contract import errors
from contract.entries import Delta, Finished, Started

OBJECTS = ResponseObjects("resp_abc", 1700000000, "m", {})
ENDED = [
    ("1-0", Started(worker="w", prompt_tokens=5)),
    ("2-0", Delta(text="Hi", token_ids=(1,))),
    ("3-0", Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=1)),
]


def last_number() -> int:
    events = response_events(OBJECTS, None)
    raw = events.opening() + events.encode(ENDED).data
    return json.loads(raw.decode().rsplit("data: ", 1)[1])["sequence_number"]


LAST = last_number()


def test_a_cursor_up_to_the_last_event_is_within_an_ended_response():
    for cursor in (None, "0", str(LAST - 1), str(LAST)):
        response_events(OBJECTS, cursor).check_within(ENDED)
    response_events(OBJECTS, str(LAST + 1)).check_within(ENDED[:2])  # not ended: no bound yet


@pytest.mark.parametrize("cursor", [LAST + 1, 10**9])
def test_a_cursor_above_the_last_event_of_an_ended_response_is_refused(cursor):
    with pytest.raises(BadCursor, match=f"{cursor} is after its last event, {LAST}"):
        response_events(OBJECTS, str(cursor)).check_within(ENDED)


def test_a_stream_whose_response_ends_below_the_cursor_ends_with_an_error_event():
    events = response_events(OBJECTS, str(LAST + 5))
    assert events.opening() == b"" and events.encode(ENDED[:2]).data == b""  # running: it waits
    block = events.encode(ENDED[2:]).data.decode()
    assert block.startswith("event: error\n") and block.endswith("\n\n")
    error = json.loads(block.split("data: ", 1)[1])
    assert error["code"] == errors.INVALID_CURSOR.code and error["sequence_number"] == LAST


def test_a_stream_from_the_last_event_ends_without_an_error():
    events = response_events(OBJECTS, str(LAST))
    assert events.opening() + events.encode(ENDED).data == b""
