"""A message's SSE stream, as Anthropic's SDKs read it.

Each event has `event: <type>`, `data: <JSON>`, and an `id:` line. The id numbers the event in
the transcript (api/endpoints/messages/objects.py). A client that reconnects with
`Last-Event-ID` (or `?starting_after=N`) gets the events after N. They are recomputed from the
job's first entry. Keep-alives are Anthropic's `ping` events, without an id. There is no
`[DONE]`: `message_stop` (or `error`) ends it.

A cursor above the last number of an ended message is refused before the stream starts
(`check_within`). A cursor may be found so only when the job ends during the stream. Then an
`invalid_request_error` error event ends the stream.
"""

from __future__ import annotations

import json

from api.endpoints.messages.objects import DELTA_EVENT, MessageObjects
from api.endpoints.protocol import EncodedEvents
from api.http.errors import anthropic
from api.streaming.cursor import BadCursor, numbered, past_end
from contract import errors
from contract.entries import Rows, is_terminal
from contract.errors import ErrorCode

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def frame(event: dict, number: int | None) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    head = f"id: {number}\n" if number is not None else ""
    return f"event: {event['type']}\n{head}data: {data}\n\n".encode()


class MessageEvents:
    def __init__(self, objects: MessageObjects, after: int) -> None:
        self._objects = objects
        self._transcript = objects.transcript()
        # the client has every event up to this number (-1: none)
        self._after = after

    def read_from(self) -> tuple[str, bool]:
        # the numbers come from the whole transcript
        return "0", False

    def check_within(self, rows: Rows) -> None:
        if not rows or not is_terminal(rows[-1][1]):
            return
        transcript = self._objects.transcript()
        for eid, entry in rows:
            transcript.feed(eid, entry)
        if self._after > transcript.seq:
            raise BadCursor(past_end(str(self._after), str(transcript.seq)))

    def opening(self) -> bytes:
        # message_start waits for the job's Started: it carries the prompt's tokens
        return b""

    def encode(self, rows: Rows) -> EncodedEvents:
        out, contents = [], 0
        for eid, entry in rows:
            first = self._transcript.seq + 1
            for n, event in enumerate(self._transcript.feed(eid, entry), first):
                if n > self._after:
                    out.append(frame(event, n))
                    contents += event["type"] == DELTA_EVENT
        last = self._transcript.seq
        # its own end
        if rows and rows[-1][0] and is_terminal(rows[-1][1]) and self._after > last:
            out.append(self.error(errors.INVALID_CURSOR, past_end(str(self._after), str(last))))
        return EncodedEvents(b"".join(out), contents)

    def keepalive(self) -> bytes:
        return PING

    def error(self, error: ErrorCode, message: str | None = None) -> bytes:
        """A stream-level failure (the queue unreachable, a bug), not the message's. It has no id,
        so a resume from the last id misses nothing."""
        return frame(anthropic(error, message or error.message)[1], None)

    def done(self) -> bytes:
        return b""


def message_events(objects: MessageObjects, raw_cursor: str | None) -> MessageEvents:
    """The stream after `raw_cursor`, or all of it. `raw_cursor` is an event number. A bad one
    raises BadCursor."""
    return MessageEvents(objects, numbered(raw_cursor))
