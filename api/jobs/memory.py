"""How full Redis is, read once a second (INFO memory). So new work is refused before Redis
runs out of memory, rather than half-written when it does.

With `maxmemory` set and `maxmemory-policy noeviction` (infra/redis.conf), Redis refuses
writes once full. Every stream in flight would then fail. So the API refuses new jobs once
used memory passes REDIS_MEMORY_HIGH of maxmemory. It answers 503 `storage_full`, with
Retry-After. The rest is left for the jobs already running to finish. Retention frees it
again. With two servers (STREAMS_REDIS_URL), the fullest of them decides. On a streams
cluster, each node counts.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.tasks import Background
from contract.servers import Servers, node_infos

log = logging.getLogger(__name__)


class MemoryWatch:
    def __init__(self, servers: Servers[aredis.Redis], high: float, every_s: float = 1.0) -> None:
        self._servers = servers
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
        """The fullest server's figures. A server without maxmemory counts as never full."""
        readings = []
        for client in self._servers.each():
            for info in await node_infos(client, "memory"):
                readings.append((int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))))
        self.used, self.maxmemory = max(readings, key=lambda r: r[0] / r[1] if r[1] else -1.0)
        if not all(limit for _, limit in readings) and not self._warned:
            self._warned = True
            log.warning("Redis has no maxmemory: it can run out of memory (see infra/redis.conf)")

    async def _run(self) -> None:
        while True:
            try:
                await self.read()
            except (RedisError, OSError) as exc:
                log.debug("could not read Redis memory: %s", exc)
            # never end the watch silently
            except Exception:
                log.exception("memory watch failed")
            await asyncio.sleep(self._every)
