"""api/streaming/sse.py: events are one-line JSON data events, and the framed content events
are byte for byte the events built whole."""

from __future__ import annotations

import pytest

from api.streaming.sse import ContentEvents, event


def chunk(text: str) -> dict:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": text}}]}


def test_an_event_is_one_data_line_with_its_id_before_it():
    assert event({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert event({"a": 1}, "5-0") == b'id: 5-0\ndata: {"a":1}\n\n'


@pytest.mark.parametrize("text", ["", "plain", 'quote " and \\ back', "line\nbreak", "emoji 🦊", "\u2028"])
def test_a_content_event_is_the_event_built_whole(text):
    assert ContentEvents(chunk).event(text, "7-1") == event(chunk(text), "7-1")


def test_a_chunk_that_does_not_carry_its_text_verbatim_is_refused():
    with pytest.raises(ValueError):
        ContentEvents(lambda text: {"length": len(text)})
