"""How full Redis is, read once a second (INFO memory), so that new work is refused before
Redis runs out of memory rather than half-written when it does.

With `maxmemory` set and `maxmemory-policy noeviction` (infra/redis.conf), Redis refuses
writes once full, and every stream in flight would fail. The API refuses new jobs (503
`storage_full`, with Retry-After) once used memory passes REDIS_MEMORY_HIGH of maxmemory,
leaving the rest for the jobs already running to finish; retention frees it again.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.background import Background

log = logging.getLogger(__name__)


class MemoryWatch:
    def __init__(self, client: aredis.Redis, high: float, every_s: float = 1.0) -> None:
        self._r = client
        self._high = high
        self._every = every_s
        self.used = 0
        self.maxmemory = 0
        self._warned = False
        self._task = Background("memory-watch", self._run)

    @property
    def full(self) -> bool:
        return self.maxmemory > 0 and self.used >= self._high * self.maxmemory

    async def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def read(self) -> None:
        info = await self._r.info("memory")
        self.used, self.maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        if not self.maxmemory and not self._warned:
            self._warned = True
            log.warning("Redis has no maxmemory: it can run out of memory (see infra/redis.conf)")

    async def _run(self) -> None:
        while True:
            try:
                await self.read()
            except (RedisError, OSError) as exc:
                log.debug("could not read Redis memory: %s", exc)
            except Exception:  # never end the watch silently
                log.exception("memory watch failed")
            await asyncio.sleep(self._every)
