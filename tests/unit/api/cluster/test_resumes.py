"""api/cluster/resumes.py on fakeredis: a requeued job past its resume deadline waits on while a live
worker serves its model and the pool has a free slot or keeps stepping."""

from __future__ import annotations

import asyncio
import time

import fakeredis

from api.cluster.resumes import Resumes
from api.jobs.workers import WorkerRegistry
from contract import keys, stats

MODEL = "m"


def announce(r, name: str, slots: int, in_use: int) -> None:
    r.zadd(keys.workers(MODEL), {name: int(time.time() * 1000)})
    r.hset(keys.worker_slots(MODEL), name, slots)
    r.hset(keys.worker_load(MODEL), name, f"{in_use} 20.0 0 0")


def steps(r, n: int) -> None:
    r.hset(keys.STATS, stats.StatField.batch("steps", MODEL), n)


def test_the_pool_can_run_it_while_it_has_a_free_slot_or_keeps_stepping():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)

    async def go() -> list[bool]:
        client = fakeredis.FakeAsyncRedis(server=server)
        resumes = Resumes(client, WorkerRegistry(client, 15), resume_wait_s=0.2)
        seen = [await resumes.may_wait(MODEL)]  # no live worker
        announce(r, "w1", slots=4, in_use=3)
        seen.append(await resumes.may_wait(MODEL))  # announced, but its process is gone
        alive = fakeredis.FakeRedis(server=server, client_name=keys.WORKER_CONNECTION_PREFIX + "w1")
        alive.ping()  # its named connection is open
        seen.append(await resumes.may_wait(MODEL))  # a free slot
        announce(r, "w1", slots=4, in_use=4)
        steps(r, 10)
        seen.append(await resumes.may_wait(MODEL))  # full, first look: give it a period
        await asyncio.sleep(0.25)
        steps(r, 20)
        seen.append(await resumes.may_wait(MODEL))  # full and stepping
        await asyncio.sleep(0.25)
        seen.append(await resumes.may_wait(MODEL))  # full and stuck for a period
        return seen

    assert asyncio.run(go()) == [False, False, True, True, True, False]


def test_a_worker_still_starting_for_the_model_is_capacity_coming():
    """A crash storm can kill every warm worker while their replacements load: the jobs
    requeued then wait for those, not fail as though the pool had no worker."""
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)

    async def go() -> list[bool]:
        client = fakeredis.FakeAsyncRedis(server=server)
        resumes = Resumes(client, WorkerRegistry(client, 15), resume_wait_s=0.2)
        r.zadd(keys.starting_workers(MODEL), {"w2": int(time.time() * 1000)})
        seen = [await resumes.may_wait(MODEL)]  # it said it was starting, but its process is gone
        starting = fakeredis.FakeRedis(server=server, client_name=keys.WORKER_CONNECTION_PREFIX + "w2")
        starting.ping()
        seen.append(await resumes.may_wait(MODEL))  # loading its model: it will take the job
        seen.append(await resumes.may_wait("other"))  # starting for another model
        r.zadd(keys.starting_workers(MODEL), {"w2": int(time.time() * 1000) - 16_000})
        seen.append(await resumes.may_wait(MODEL))  # silent past WORKER_STALE_SECONDS
        return seen

    assert asyncio.run(go()) == [False, True, False, False]
