"""api/services.py against a real Redis that restarts: every connection the shared pool held
is dead afterwards, and each command that draws one must reconnect and succeed, not answer
its request with a 503. (Found by CI: after a restart, requests that drew a stale pooled
connection failed at once, because the retry given to the client was never used: with an
explicit pool, redis-py takes the retry from the pool's connections.)"""

from __future__ import annotations

import asyncio
import signal

import pytest

from api.services import shared_client
from devstack.processes import start_redis

pytestmark = pytest.mark.integration


def test_every_pooled_connection_reconnects_after_a_redis_restart(tmp_path):
    proc, url = start_redis(tmp_path)
    port = int(url.rsplit(":", 1)[1].split("/")[0])

    async def run() -> list[object]:
        nonlocal proc
        client = shared_client(url, size=8, wait_s=2.0, socket_timeout=5, socket_connect_timeout=2)
        try:

            async def hold() -> None:  # eight commands at once: eight pooled connections
                await client.blpop(["ts:test:nothing"], timeout=0.2)

            await asyncio.gather(*(hold() for _ in range(8)))
            proc.signal(signal.SIGKILL)
            proc.popen.wait()
            proc, _ = start_redis(tmp_path, port=port)
            return await asyncio.gather(*(client.ping() for _ in range(8)), return_exceptions=True)
        finally:
            await client.aclose()

    try:
        results = asyncio.run(run())
    finally:
        proc.stop()
    assert results == [True] * 8, results
