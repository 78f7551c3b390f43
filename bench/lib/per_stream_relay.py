"""The baseline for bench/scale_out.py: tokenspool's API with a one-connection-per-stream relay.

The real API watches every open stream over one Redis connection (api/streaming/reader.py). This module
serves the very same app with one change, for comparison only: each open stream blocks in
its own `XREAD BLOCK` on its own Redis connection, the design most SSE-over-Redis relays use.

    uvicorn --factory bench.lib.per_stream_relay:create_app
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import redis.asyncio as aredis
from redis.exceptions import RedisError
from starlette.applications import Starlette

import api.services
from api.app import create_app as create_tokenspool_app
from api.streaming.reader import Wake, WakeReason


class PerStreamReader:
    """StreamReader's interface; every watch owns a connection and blocks on it."""

    def __init__(self, url: str, client: aredis.Redis, block_ms: int = 1000) -> None:
        self._url = url
        self._open = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    @property
    def watched(self) -> int:
        return self._open

    @contextlib.asynccontextmanager
    async def watch(self, key: str, cursor: str) -> AsyncIterator[_BlockingWatch]:
        conn = aredis.Redis.from_url(self._url, single_connection_client=True, socket_timeout=None)
        self._open += 1
        try:
            yield _BlockingWatch(conn, key)
        finally:
            self._open -= 1
            await conn.aclose()


class _BlockingWatch:
    def __init__(self, conn: aredis.Redis, key: str) -> None:
        self._conn = conn
        self._key = key

    async def wait(self, cursor: str, timeout: float) -> Wake:
        try:
            got = await self._conn.xread({self._key: cursor}, count=1, block=max(int(timeout * 1000), 1))
        except RedisError:
            return WakeReason.READY  # let the relay read and endpoint the outage
        return WakeReason.READY if got else WakeReason.TIMED_OUT


def create_app() -> Starlette:
    api.services.StreamReader = PerStreamReader  # type: ignore[misc,assignment]
    return create_tokenspool_app()
