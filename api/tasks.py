"""A task this API process runs beside its requests: the stream reader, the reaper, the batch driver.

The app's lifespan starts and stops it. The periodic ones share two things here. One is a
tick repeated through errors. The other is a Redis lock that lets one API process act at a
time."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import RedisError

from contract.lua import queues

log = logging.getLogger(__name__)


# how long a stop waits for its task
STOP_S = 5.0


class Background:
    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._run = run
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self, timeout_s: float = STOP_S) -> None:
        """Cancel the task and wait for it, cancelling again until it ends. A cancel that
        lands inside a Redis client's reconnect can come out as a connection error. The
        task's loop then retries. A shutdown must not wait on a Redis that is gone. Gives up
        after `timeout_s` (logged): the process is ending anyway."""
        task = self._task
        if task is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not task.done() and asyncio.get_running_loop().time() < deadline:
            task.cancel()
            await asyncio.wait({task}, timeout=0.2)
        if not task.done():
            log.warning("%s did not stop within %.0f s; leaving it", self._name, timeout_s)
        elif not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("%s had failed: %r", self._name, exc)


class Leader:
    """One API process at a time holds `key`. Its holder keeps it by asking again within `ms`.
    If it dies, another takes over once the lock expires."""

    def __init__(self, client: aredis.Redis, key: str) -> None:
        self._key = key
        self._me = uuid.uuid4().hex
        self._script = client.register_script(queues.TAKE_OR_EXTEND)

    async def held(self, ms: int) -> bool:
        return bool(await self._script(keys=[self._key], args=[self._me, ms]))


async def every(interval_s: float, tick: Callable[[], Awaitable[object]], what: str) -> None:
    """Run `tick` forever, `interval_s` apart. A lost Redis or a bug ends one tick, never the
    loop. The loop lives as long as the process."""
    while True:
        try:
            await tick()
        except (RedisError, OSError) as exc:
            log.debug("%s tick failed: %s", what, exc)
        except Exception:
            log.exception("%s tick failed", what)
        await asyncio.sleep(interval_s)
