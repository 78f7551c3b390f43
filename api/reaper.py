"""Finds dead attempts and gives their jobs to another worker, whether or not a client is
attached.

Every API process runs one; a Redis lock lets only one act at a time. Each tick it looks at
the running attempts (`ts:running`) and declares one dead when its heartbeat key has expired
(a hung or frozen worker) or when none of its worker's named connections is left (a killed
process: the kernel closes its sockets at once). A dead attempt's job is requeued as a
continuation, or ends with worker_lost once its attempts are used up. This does not wait
for RQ's own maintenance (every 600 s) or its job_timeout + 60 s rule.

Every `FORGET_EVERY_S` it also drops the workers that stopped announcing themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import redis.asyncio as aredis
from redis.exceptions import RedisError

from api.background import Background
from api.jobstore import JobStore
from api.registry import WorkerRegistry
from contract import keys

log = logging.getLogger(__name__)

FORGET_EVERY_S = 10.0

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""


class Reaper:
    def __init__(
        self,
        client: aredis.Redis,
        store: JobStore,
        registry: WorkerRegistry,
        interval_s: float,
        settle_s: float,
    ) -> None:
        self._r = client
        self._store = store
        self._registry = registry
        self._interval = interval_s
        self._settle = settle_s  # after a Redis restart, let workers reconnect and beat first
        self._me = uuid.uuid4().hex
        self._lock = client.register_script(_EXTEND)
        self._task = Background("reaper", self._run)
        self._forget_at = 0.0  # monotonic

    async def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except (RedisError, OSError) as exc:
                log.debug("reaper tick failed: %s", exc)
            await asyncio.sleep(self._interval)

    async def tick(self) -> int:
        """One look at the running attempts; returns how many were taken from dead workers."""
        lock_ms = int(max(self._interval * 4, 1.0) * 1000)
        if not await self._lock(keys=[keys.REAPER_LOCK], args=[self._me, lock_ms]):
            return 0
        if time.monotonic() >= self._forget_at:
            self._forget_at = time.monotonic() + FORGET_EVERY_S
            await self._registry.forget_silent()
        running = await self._store.running()
        if not running:
            return 0
        info = await self._r.info("server")
        if int(info.get("uptime_in_seconds", 0)) < self._settle:
            return 0
        connected = {
            c.get("name", "")
            for c in await self._r.client_list()
            if c.get("name", "").startswith(keys.WORKER_CONNECTION_PREFIX)
        }
        taken = 0
        for a in running:
            gone = bool(a.worker) and keys.WORKER_CONNECTION_PREFIX + a.worker not in connected
            if a.beating and not gone:
                continue
            outcome = await self._store.abandon(a.completion_id, a.epoch)
            if outcome in (1, 2):
                taken += 1
                log.warning(
                    "attempt %d of %s on %s is dead (%s); %s",
                    a.epoch,
                    a.completion_id,
                    a.worker,
                    "connection gone" if gone else "heartbeat expired",
                    "requeued" if outcome == 1 else "attempts used up: worker_lost",
                )
        return taken
