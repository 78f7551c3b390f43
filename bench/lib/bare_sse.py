"""The ceiling for bench/scale_out.py: a bare Starlette endpoint that streams the same SSE
events as tokenspool (same chunk objects, same framing, same ids) from memory, as fast as
the event loop sends them. No Redis, no queue: what this machine can push through HTTP.

    uvicorn --factory bench.lib.bare_sse:create_app
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from api.endpoints.chat.objects import ChatChunks, Chunks
from api.streaming import sse
from contract.entries import Finished


async def _events(chunks: Chunks, n: int) -> AsyncIterator[bytes]:
    yield sse.event(chunks.opening() or {}, "0-0")
    ms = int(time.time() * 1000)
    for i in range(n):
        yield sse.event(chunks.content(f" w{i}"), f"{ms}-{i}")
    end = Finished(finish_reason="length", prompt_tokens=0, completion_tokens=n)
    yield sse.event(chunks.finish(end), f"{ms}-{n}")
    yield sse.DONE


async def complete(request: Request) -> StreamingResponse:
    body = json.loads(await request.body())
    chunks = ChatChunks("chatcmpl-bare", int(time.time()), body["model"])
    return StreamingResponse(
        _events(chunks, int(body["max_tokens"])), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS
    )


def create_app() -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
