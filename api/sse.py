"""Server-Sent Events framing for OpenAI streams.

Each event is `data: <one-line JSON>\\n\\n`; the stream ends with `data: [DONE]\\n\\n`.
Keep-alives are data events too (an empty chunk), never `: comment` lines or bare `retry:`:
openai-python turns such data-less events into a JSON error once an `id:` line has been
seen, and resumable streams (event ids) must not break the official SDK.
"""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"

HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx and friends: do not buffer the stream
}
MEDIA_TYPE = "text/event-stream"


def event(obj: dict, event_id: str | None = None) -> bytes:
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {data}\n\n".encode()
