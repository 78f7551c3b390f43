"""A job's entries as the SSE events of one stream, for chunk endpoints.

`ChunkEvents` decides where a stream starts reading (`read_from`). It encodes each batch of
entries into one write. A resuming client already has the events of the entry its cursor
names (see api/streaming/cursor.py). They are left out, all but the usage chunk that may
follow a finish. `ChunkEvents` counts the content events it wrote, for the
time-to-first-token and inter-token metrics.
"""

from __future__ import annotations

from api.endpoints.chat.objects import Chunks
from api.endpoints.protocol import EncodedEvents
from api.streaming import sse
from api.streaming.cursor import OPENING, USAGE_SUFFIX, BadCursor, Cursor, past_end
from api.streaming.reader import stream_id
from contract.entries import Delta, Failed, Finished, Rows, Started, is_terminal
from contract.errors import ErrorCode, failure_body


class ChunkEvents:
    def __init__(self, chunks: Chunks, cursor: Cursor | None) -> None:
        self._chunks = chunks
        self._fresh = cursor is None
        # The entry the client's last event came from, if it must be read again (a finish
        # whose usage chunk may be missing); resuming after the opening is a fresh read.
        self._at = None if cursor is None or cursor.after_opening else cursor
        self._content = sse.ContentEvents(chunks.content)

    def read_from(self) -> tuple[str, bool]:
        """(stream id to read after, whether that entry itself is read too). The client's last entry
        is read again, for two reasons. The rest of its events may be missing (a finish's usage
        chunk). Also, a terminal entry ends the relay, so a client that missed only `[DONE]` gets
        it."""
        if self._at is None:
            return "0", False
        return self._at.entry_id, True

    def check_within(self, rows: Rows) -> None:
        """A cursor at the terminal entry still gets the rest of that entry's events and [DONE].
        This holds for a cursor at its usage chunk too. A cursor after it names no event of this
        stream."""
        if self._at is None or not rows or not is_terminal(rows[-1][1]):
            return
        last = rows[-1][0]
        if stream_id(self._at.entry_id) > stream_id(last):
            raise BadCursor(past_end(self._at.entry_id, last))

    def opening(self) -> bytes:
        obj = self._chunks.opening() if self._fresh else None
        return sse.event(obj, OPENING) if obj is not None else b""

    def encode(self, rows: Rows) -> EncodedEvents:
        out: list[bytes] = []
        contents = 0
        for eid, entry in rows:
            # the client has it
            sent = self._at is not None and eid == self._at.entry_id
            if isinstance(entry, Delta):
                if sent:
                    continue
                if entry.calls or entry.logprobs or entry.reasoning:
                    out.append(sse.event(self._chunks.delta(entry), eid))
                    contents += 1
                elif entry.text:
                    out.append(self._content.event(entry.text, eid))
                    contents += 1
            elif isinstance(entry, Finished):
                if not sent:
                    out.append(sse.event(self._chunks.finish(entry), eid))
                usage_sent = sent and self._at is not None and self._at.usage_sent
                if self._chunks.include_usage and not usage_sent:
                    out.append(sse.event(self._chunks.usage(entry), eid + USAGE_SUFFIX))
            elif isinstance(entry, Failed) and not sent:
                out.append(sse.event(failure_body(entry), eid or None))
            elif isinstance(entry, Started) and entry.epoch > 1:
                # a takeover: a note for readers that look
                out.append(sse.RECOVERED)
        return EncodedEvents(b"".join(out), contents)

    def keepalive(self) -> bytes:
        return sse.event(self._chunks.keepalive())

    def error(self, error: ErrorCode, message: str | None = None) -> bytes:
        return sse.event(error.body(message))

    def done(self) -> bytes:
        return sse.DONE


def chunk_events(chunks: Chunks, raw_cursor: str | None) -> ChunkEvents:
    """The events of a chunk endpoint's stream, after `raw_cursor` or from the start. `raw_cursor`
    is an event id (see api/streaming/cursor.py). A bad one raises BadCursor."""
    return ChunkEvents(chunks, Cursor.parse(raw_cursor) if raw_cursor else None)
