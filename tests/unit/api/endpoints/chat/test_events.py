"""A completion's entries as SSE events: one event per entry, whatever it carries."""

from __future__ import annotations

import json

from api.endpoints.chat.events import ChunkEvents
from api.endpoints.chat.objects import ChatChunks
from contract.entries import Delta


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
