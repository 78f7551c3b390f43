"""api.jobs.workers.WorkerRegistry: the workers as the API sees them (against fakeredis)."""

import asyncio
import time

import fakeredis

from api.jobs.workers import WorkerRegistry
from contract import keys

MODEL = "m"


def registry(r) -> WorkerRegistry:
    return WorkerRegistry(r, stale_s=15)


async def announce(r, worker: str, slots: int, age_s: float) -> None:
    await r.sadd(keys.MODELS, MODEL)
    await r.zadd(keys.workers(MODEL), {worker: int((time.time() - age_s) * 1000)})
    await r.hset(keys.worker_slots(MODEL), worker, slots)


def test_slots_sum_the_live_workers_only():
    async def scenario():
        r = fakeredis.FakeAsyncRedis()
        await announce(r, "a", 8, age_s=1)
        await announce(r, "b", 2, age_s=3)
        await announce(r, "dead", 4, age_s=60)
        assert await registry(r).slots([MODEL, "other"]) == {MODEL: 10, "other": 0}

    asyncio.run(scenario())


def test_silent_workers_are_forgotten_and_live_ones_kept():
    async def scenario():
        r = fakeredis.FakeAsyncRedis()
        await announce(r, "a", 8, age_s=1)
        await announce(r, "dead", 4, age_s=60)
        s = registry(r)
        await s.forget_silent()
        assert await r.zrange(keys.workers(MODEL), 0, -1) == [b"a"]
        assert await r.hgetall(keys.worker_slots(MODEL)) == {b"a": b"8"}
        assert await s.live_models() == {MODEL: 1}

    asyncio.run(scenario())
