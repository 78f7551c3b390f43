"""A lean SSE load generator for bench/scale_out.py: many concurrent streamed completions over
raw asyncio connections (HTTP/1.1, httptools' C parser), so that the client, which shares
this machine's two cores with the servers, spends as little CPU per event as possible.

Each stream keeps its raw body (checked against the stream contract after the run, off the
clock) and, when asked, the receive time of every event id, for append-to-receipt latency:
tokenspool's event ids are Redis stream ids, whose first part is the Redis server's clock in
ms at the XADD, on this same machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from dataclasses import dataclass, field

import httptools

_ID = re.compile(rb"(?:^|\n)id: (\d+)-\d+\n")


@dataclass
class Stream:
    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    opened: float = 0.0  # request written (monotonic)
    closed: float = 0.0  # response complete (monotonic)
    latencies_ms: list[float] = field(default_factory=list)
    error: str = ""


class _Response:
    def __init__(self, stream: Stream, latency: bool) -> None:
        self.stream = stream
        self.latency = latency
        self.done = False

    def on_status(self, _status: bytes) -> None:
        pass

    def on_body(self, data: bytes) -> None:
        self.stream.body += data
        if self.latency:
            now_ms = time.time() * 1000
            for m in _ID.finditer(data):
                ms = int(m.group(1))
                if ms:  # "0-0" is the role chunk, not an appended entry
                    self.stream.latencies_ms.append(now_ms - ms)

    def on_message_complete(self) -> None:
        self.done = True


async def stream_once(
    host: str, port: int, payload: dict, latency: bool = False, connected: asyncio.Event | None = None
) -> Stream:
    """POST one streamed completion and read it to the end."""
    out = Stream()
    body = json.dumps(payload).encode()
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    except OSError as exc:
        out.error = f"connect: {exc}"
        return out
    try:
        if connected is not None:
            await connected.wait()  # every client connects first, then all send at once
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        out.opened = time.monotonic()
        resp = _Response(out, latency)
        parser = httptools.HttpResponseParser(resp)
        while not resp.done:
            data = await reader.read(65536)
            if not data:
                out.error = "connection closed before the end of the response"
                break
            parser.feed_data(data)
        out.status = parser.get_status_code()
        out.closed = time.monotonic()
    except (OSError, httptools.HttpParserError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return out


async def run_streams(
    host: str,
    port: int,
    payload: dict,
    n: int,
    latency: bool = False,
    connect_batch: int = 200,
) -> tuple[list[Stream], float]:
    """Open `n` streams concurrently; returns them and the wall time from the first request
    to the last response's end."""
    go = asyncio.Event()
    tasks = []
    for i in range(0, n, connect_batch):  # connect in batches: the listen backlog is finite
        batch = [
            asyncio.create_task(stream_once(host, port, payload, latency, go))
            for _ in range(min(connect_batch, n - i))
        ]
        tasks += batch
        await asyncio.sleep(0.05)
    t0 = time.monotonic()
    go.set()
    streams = await asyncio.gather(*tasks)
    return list(streams), time.monotonic() - t0
