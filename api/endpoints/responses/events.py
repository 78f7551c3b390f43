"""A response's SSE stream: every event of its transcript numbered above the client's cursor.

Each event is `event: <type>`, `id: <sequence_number>`, `data: <JSON>`. A resume names where
it stands by `starting_after` or by `Last-Event-ID` (the same number). The stream is
recomputed from the job's first entry, so the numbers never change. Keep-alives are a comment
line with no blank line after it. Such a line dispatches no event in any SSE reader. A
comment ended by a blank line would not do. Once openai-python has seen an `id:`, it turns
such a comment into a JSON error. The stream has no `data: [DONE]`, as OpenAI's has none.

A cursor above the last number of an ended response is refused before the stream starts
(`check_within`). A cursor may be found so only when the job ends during the stream. Then an
`invalid_cursor` error event ends the stream, numbered as the response's last event.
"""

from __future__ import annotations

import json

from api.endpoints.protocol import EncodedEvents
from api.endpoints.responses.objects import DELTA_EVENTS, ResponseObjects
from api.streaming.cursor import BadCursor, numbered, past_end
from contract import errors
from contract.entries import Rows, is_terminal
from contract.errors import ErrorCode

KEEPALIVE = b": keepalive\n"


def frame(event: dict) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\nid: {event['sequence_number']}\ndata: {data}\n\n".encode()


class ResponseEvents:
    def __init__(self, objects: ResponseObjects, after: int) -> None:
        self._objects = objects
        self._transcript = objects.transcript()
        # the client has every event up to this number (-1: none)
        self._after = after
        self._last = after

    def read_from(self) -> tuple[str, bool]:
        # the numbers come from the whole transcript
        return "0", False

    def check_within(self, rows: Rows) -> None:
        if not rows or not is_terminal(rows[-1][1]):
            return
        transcript = self._objects.transcript()
        transcript.start()
        for eid, entry in rows:
            transcript.feed(eid, entry)
        if self._after > transcript.seq:
            raise BadCursor(past_end(str(self._after), str(transcript.seq)))

    def opening(self) -> bytes:
        return self._send(self._transcript.start()).data

    def encode(self, rows: Rows) -> EncodedEvents:
        events = [event for eid, entry in rows for event in self._transcript.feed(eid, entry)]
        out = self._send(events)
        last = self._transcript.seq
        # its own end
        if rows and rows[-1][0] and is_terminal(rows[-1][1]) and self._after > last:
            self._last = last
            return EncodedEvents(
                out.data + self.error(errors.INVALID_CURSOR, past_end(str(self._after), str(last))), 0
            )
        return out

    def _send(self, events: list[dict]) -> EncodedEvents:
        out, contents = [], 0
        for event in events:
            if event["sequence_number"] > self._after:
                out.append(frame(event))
                self._last = event["sequence_number"]
                contents += event["type"] in DELTA_EVENTS
        return EncodedEvents(b"".join(out), contents)

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def error(self, error: ErrorCode, message: str | None = None) -> bytes:
        """A stream-level failure (the queue unreachable, a bug), not the response's. It repeats the
        last number sent, so a resume from it misses nothing."""
        event = {
            "type": "error",
            "sequence_number": max(self._last, 0),
            "code": error.code,
            "message": message or error.message,
            "param": None,
        }
        return frame(event)

    def done(self) -> bytes:
        return b""


def response_events(objects: ResponseObjects, raw_cursor: str | None) -> ResponseEvents:
    """The stream after `raw_cursor`, or all of it. `raw_cursor` is a sequence number. A bad one
    raises BadCursor."""
    return ResponseEvents(objects, numbered(raw_cursor))
