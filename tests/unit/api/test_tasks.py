"""api/tasks.py: a background task stops when asked, even one whose first cancel a
Redis client turned into a connection error that its loop retries."""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import ConnectionError as RedisConnectionError

from api.tasks import Background


def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends():
    swallowed = []

    async def run() -> None:
        while True:  # as a reconnect loop does: an error, a short wait, again
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(1)  # the first cancel comes out as a connection error
                try:
                    raise RedisConnectionError("closed")
                except RedisConnectionError:
                    pass

    async def main() -> float:
        bg = Background("looping", run)
        bg.start()
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await bg.stop()
        return time.monotonic() - started

    assert asyncio.run(main()) < 2.0 and swallowed == [1]
