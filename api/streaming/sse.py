"""Server-Sent Events framing for OpenAI streams.

Each event is `data: <one-line JSON>\\n\\n`. The stream ends with `data: [DONE]\\n\\n`.
Keep-alives are data events too (an empty chunk), never `: comment` lines or bare `retry:`.
Once an `id:` line has been seen, openai-python turns such data-less events into a JSON
error. Resumable streams (event ids) must not break the official SDK.
"""

from __future__ import annotations

import json
from collections.abc import Callable

DONE = b"data: [DONE]\n\n"
RECOVERED = b": continued on another worker\n"
"""A lone comment line, part of the next event, where a later attempt of the job takes over
(its worker died, hung or shut down): every SSE reader skips comment lines, and an event
that has data is dispatched as usual; the playground shows it as a "recovered" note."""

HEADERS = {
    "Cache-Control": "no-cache",
    # nginx and friends: do not buffer the stream
    "X-Accel-Buffering": "no",
}
MEDIA_TYPE = "text/event-stream"


def event(obj: dict, event_id: str | None = None) -> bytes:
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {data}\n\n".encode()


# private-use code points: never in a real chunk
_MARK = "\ue000tokenspool-content\ue001"


class ContentEvents:
    """`event(make(text), event_id)` for the many content chunks of one stream, byte for
    byte. It does not rebuild and re-encode the whole chunk for every token (the relay's hot
    path). The chunk is encoded once around a marker. Each event only encodes its text into
    that frame."""

    def __init__(self, make: Callable[[str], dict]) -> None:
        data = json.dumps(make(_MARK), ensure_ascii=False, separators=(",", ":"))
        head, found, tail = data.partition(json.dumps(_MARK, ensure_ascii=False))
        if not found:
            raise ValueError("the chunk does not carry its text verbatim")
        self._head, self._tail = head, tail

    def event(self, text: str, event_id: str) -> bytes:
        data = json.dumps(text, ensure_ascii=False)
        return f"id: {event_id}\ndata: {self._head}{data}{self._tail}\n\n".encode()
