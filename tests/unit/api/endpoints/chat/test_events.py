"""A completion's entries as SSE events: one event per entry, whatever it carries; a resume's
cursor is bounded by an ended stream's terminal entry."""

from __future__ import annotations

import json

import pytest

from api.endpoints.chat.events import ChunkEvents, chunk_events
from api.endpoints.chat.objects import ChatChunks
from api.streaming.cursor import BadCursor
from contract.entries import Delta, Finished


def test_a_delta_of_thinking_alone_is_an_event_of_its_own():
    rows = [
        ("1-0", Delta(text="", token_ids=(1,), reasoning="hmm")),
        ("2-0", Delta(text="Yes", token_ids=(2,))),
        ("3-0", Delta(text="", token_ids=())),  # nothing the client lacks: no event
    ]
    encoded = ChunkEvents(ChatChunks("chatcmpl-1", 1, "m"), None).encode(rows)
    events = [block for block in encoded.data.decode().split("\n\n") if block]
    assert encoded.contents == 2 and [e.splitlines()[0] for e in events] == ["id: 1-0", "id: 2-0"]
    deltas = [json.loads(e.splitlines()[1].removeprefix("data: "))["choices"][0]["delta"] for e in events]
    assert deltas == [{"reasoning_content": "hmm"}, {"content": "Yes"}]


ENDED = [
    ("1-0", Delta(text="Hi", token_ids=(1,))),
    ("2-0", Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1)),
]


@pytest.mark.parametrize("cursor", [None, "0-0", "1-0", "1-5", "2-0", "2-0/usage"])
def test_a_cursor_up_to_an_ended_streams_terminal_entry_is_within_it(cursor):
    chunk_events(ChatChunks("chatcmpl-1", 1, "m"), cursor).check_within(ENDED)


@pytest.mark.parametrize("cursor", ["2-1", "3-0", "99999999999999-0", "99999999999999-0/usage"])
def test_a_cursor_after_an_ended_streams_terminal_entry_is_refused(cursor):
    with pytest.raises(BadCursor, match="after its last event, 2-0"):
        chunk_events(ChatChunks("chatcmpl-1", 1, "m"), cursor).check_within(ENDED)


def test_without_the_terminal_entry_nothing_is_refused():
    """Rows that do not end with the terminal entry (a stream not read to its end) bound nothing."""
    chunk_events(ChatChunks("chatcmpl-1", 1, "m"), "3-0").check_within(ENDED[:1])
    chunk_events(ChatChunks("chatcmpl-1", 1, "m"), "3-0").check_within([])
