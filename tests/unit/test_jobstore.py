"""api.jobs.JobStore's view of the workers (against fakeredis)."""

import asyncio
import time

import fakeredis

from api.jobs import JobStore
from contract import keys
from contract.queueing import Recovery

MODEL = "m"


def store(r) -> JobStore:
    return JobStore(
        r, None, queue_wait_s=60, worker_stale_s=15, recovery=Recovery(job_ttl_s=600, retention_s=60)
    )


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
        assert await store(r).slots([MODEL, "other"]) == {MODEL: 10, "other": 0}

    asyncio.run(scenario())


def test_silent_workers_are_forgotten_and_live_ones_kept():
    async def scenario():
        r = fakeredis.FakeAsyncRedis()
        await announce(r, "a", 8, age_s=1)
        await announce(r, "dead", 4, age_s=60)
        s = store(r)
        await s.forget_silent_workers()
        assert await r.zrange(keys.workers(MODEL), 0, -1) == [b"a"]
        assert await r.hgetall(keys.worker_slots(MODEL)) == {b"a": b"8"}
        assert await s.live_models() == {MODEL: 1}

    asyncio.run(scenario())
