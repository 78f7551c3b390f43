"""Cache-aware routing's policy and deadlines (api/jobs/routing.py), and the move back to the shared
queue, on fakeredis with real Lua."""

from __future__ import annotations

import asyncio
import time

import fakeredis

from api.cluster.figures import ClusterStats
from api.jobs.routing import Assignment, Candidate, Router, choose, wait_ms
from api.jobs.workers import WorkerRegistry
from api.pool_settings import Routing
from contract import keys, queueing, stats, tiers
from contract.jobspec import JobSpec, Message
from contract.prefixes import prefixes
from contract.servers import Servers
from contract.settings import Recovery

MODEL = "m"
SYSTEM = Message("system", "You are a helpful assistant. " * 40)


def chat(*messages: Message, **kw) -> JobSpec:
    return JobSpec(id="chatcmpl-x", kind="chat", model=MODEL, messages=messages, **kw)


SETTINGS = Routing(wait_s=1.0, min_chars=100, balance_abs=4, balance_rel=1.5)


def test_the_longest_match_wins_unless_the_pool_is_imbalanced_or_it_is_full():
    a = Candidate("a", matched=2000, slots=4, in_use=1, routed=0)
    b = Candidate("b", matched=300, slots=4, in_use=0, routed=0)
    assert choose([a, b], SETTINGS) == a
    assert choose([a], SETTINGS) is None  # one worker: its queue is the shared one
    assert choose([Candidate("a", 50, 4, 0, 0), b], SETTINGS) == b  # a's match is too short
    assert choose([Candidate("a", 90, 4, 0, 0), Candidate("b", 80, 4, 0, 0)], SETTINGS) is None
    hot = Candidate("a", 2000, 16, 14, 0)  # a popular prefix, piled on one worker
    assert choose([hot, Candidate("b", 0, 16, 2, 0)], SETTINGS) is None
    full = Candidate("a", 2000, 4, 3, 1)
    assert choose([full, Candidate("b", 0, 4, 1, 0)], SETTINGS) is None  # b has a free slot
    assert choose([full, Candidate("b", 0, 4, 4, 0)], SETTINGS) == full  # nobody has one: wait for it
    tie = [Candidate("a", 2000, 4, 2, 0), Candidate("b", 2000, 4, 1, 0)]
    assert choose(tie, SETTINGS).name == "b"


def test_the_deadline_grows_with_what_waits_ahead_of_the_job():
    assert wait_ms(Candidate("a", 1, 4, 0, 0), SETTINGS) == 1000
    assert wait_ms(Candidate("a", 1, 4, 1, 2), SETTINGS) == 3000
    assert wait_ms(Candidate("a", 1, 4, 4, 9), SETTINGS) == 4000


def pool(r: fakeredis.FakeAsyncRedis, held: dict[str, list[str]], in_use: dict[str, int]) -> None:
    async def go() -> None:
        now = int(time.time() * 1000)
        for name, digests in held.items():
            await r.zadd(keys.workers(MODEL), {name: now})
            await r.hset(keys.worker_slots(MODEL), name, 4)
            await r.hset(keys.worker_load(MODEL), name, f"{in_use.get(name, 0)} 10.0 0 0")
            if digests:
                await r.sadd(keys.held_prefixes(name), *digests)

    asyncio.run(go())


def enqueue(server: fakeredis.FakeServer, spec: JobSpec, route: Assignment) -> None:
    """As the job store enqueues a routed job: its record, the push and the deadline at once."""
    sync = fakeredis.FakeRedis(server=server)
    queueing.enqueue(
        Servers(sync, sync), spec.to_dict(), 0, Recovery(), worker=route.worker, deadline_ms=route.deadline_ms
    )


def test_a_job_is_routed_to_the_holder_and_goes_back_once_past_its_deadline():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeAsyncRedis(server=server)
    first = chat(SYSTEM, Message("user", "Tell me about lighthouses."))
    digests = [d for d, _ in prefixes(first, answer="They guide ships.")]
    pool(r, {"w1": [], "w2": digests}, {})
    router = Router(r, WorkerRegistry(r, 15), SETTINGS)
    follow = chat(*first.messages, Message("assistant", "They guide ships."), Message("user", "And storms?"))

    async def go() -> tuple:
        route = await router.route(follow)
        routed_queue = keys.rq_queue_key(tiers.routed_queue_name(MODEL, "default", "w2"))
        enqueue(server, follow, route)
        early = await router.fall_back(MODEL)
        member = (await r.zrange(keys.routed(MODEL), 0, -1))[0]
        await r.zadd(keys.routed(MODEL), {member: 0})  # its deadline has passed
        back = await router.fall_back(MODEL)
        again = await router.fall_back(MODEL)
        shared = await r.lrange(keys.rq_queue_key(tiers.queue_name(MODEL)), 0, -1)
        ttl = await r.ttl(f"rq:job:{keys.rq_job_id(follow.id, 0)}")
        return route, early, back, again, shared, await r.llen(routed_queue), await r.hgetall(keys.STATS), ttl

    route, early, back, again, shared, left, counted, ttl = asyncio.run(go())
    assert route.worker == "w2" and route.matched_chars > 1000
    assert 0 < ttl <= Recovery().job_ttl_s  # RQ's record expires as an enqueued one does
    assert (early, back, again, left) == (0, 1, 0, 0)  # moved once, never twice
    assert shared == [keys.rq_job_id(follow.id, 0).encode()]
    assert counted[stats.StatField.routed(MODEL).encode()] == b"1"
    assert counted[stats.StatField.route_fallbacks(MODEL).encode()] == b"1"


def test_a_job_that_falls_back_waits_where_its_arrival_puts_it_never_ahead_of_earlier_jobs():
    # Alice's two jobs wait in the shared queue; Bob's, routed to the worker holding his
    # prompt, misses its deadline; Carol's comes after it. Bob's goes back between them.
    server = fakeredis.FakeServer()
    r = fakeredis.FakeAsyncRedis(server=server)
    sync = fakeredis.FakeRedis(server=server)
    bob = chat(SYSTEM, Message("user", "Hi"))
    pool(r, {"w1": [d for d, _ in prefixes(bob)], "w2": []}, {})
    router = Router(r, WorkerRegistry(r, 15), SETTINGS)

    def shared(job_id: str) -> None:
        spec = JobSpec(id=job_id, kind="chat", model=MODEL, messages=(Message("user", "a"),))
        queueing.enqueue(Servers(sync, sync), spec.to_dict(), 0, Recovery())
        time.sleep(0.002)  # RQ stamps arrivals to the microsecond: keep them apart

    async def go() -> list[bytes]:
        shared("chatcmpl-alice0")
        shared("chatcmpl-alice1")
        enqueue(server, bob, await router.route(bob))
        time.sleep(0.002)
        shared("chatcmpl-carol")
        await r.zadd(keys.routed(MODEL), {(await r.zrange(keys.routed(MODEL), 0, -1))[0]: 0})
        assert await router.fall_back(MODEL) == 1
        return await r.lrange(keys.rq_queue_key(tiers.queue_name(MODEL)), 0, -1)

    order = [raw.decode() for raw in asyncio.run(go())]
    names = ["chatcmpl-alice0", "chatcmpl-alice1", bob.id, "chatcmpl-carol"]
    assert order == [keys.rq_job_id(n, 0) for n in names]


def test_a_job_its_worker_took_is_not_moved_and_a_dead_worker_s_are_moved_at_once():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeAsyncRedis(server=server)
    spec = chat(SYSTEM, Message("user", "Hi"))
    pool(r, {"w1": [d for d, _ in prefixes(spec)], "w2": []}, {})
    router = Router(r, WorkerRegistry(r, 15), SETTINGS)

    async def go() -> tuple:
        taken = await router.route(spec)
        enqueue(server, spec, taken)
        await r.lpop(
            keys.rq_queue_key(tiers.routed_queue_name(MODEL, "default", "w1"))
        )  # its worker takes it
        await r.zadd(keys.routed(MODEL), {(await r.zrange(keys.routed(MODEL), 0, -1))[0]: 0})
        kept = await router.fall_back(MODEL)
        other = JobSpec(id="chatcmpl-y", kind="chat", model=MODEL, messages=spec.messages)
        enqueue(server, other, await router.route(other))
        dead = await router.fall_back(MODEL, "w1")  # before its deadline: its worker died
        return taken, kept, dead

    taken, kept, dead = asyncio.run(go())
    assert taken.worker == "w1" and kept == 0 and dead == 1


def test_routing_off_and_the_tiers_it_leaves_alone():
    r = fakeredis.FakeAsyncRedis()
    spec = chat(SYSTEM, Message("user", "Hi"))
    pool(r, {"w1": [d for d, _ in prefixes(spec)], "w2": []}, {})
    off = Router(r, WorkerRegistry(r, 15), Routing(enabled=False))
    on = Router(r, WorkerRegistry(r, 15), SETTINGS)
    batch = JobSpec(id="chatcmpl-b", kind="chat", model=MODEL, messages=spec.messages, priority="batch")
    assert asyncio.run(off.route(spec)) is None and asyncio.run(on.route(batch)) is None


def test_a_routed_job_counts_in_its_tier_s_depth_until_its_worker_takes_it():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeAsyncRedis(server=server)
    spec = chat(SYSTEM, Message("user", "Hi"), priority="flex")
    pool(r, {"w1": [d for d, _ in prefixes(spec)], "w2": []}, {})
    router = Router(r, WorkerRegistry(r, 15), SETTINGS)
    stats = ClusterStats(Servers(r, r))

    async def go() -> tuple[dict, dict]:
        enqueue(server, spec, await router.route(spec))
        waiting = (await stats.queue_depths([MODEL]))[MODEL]
        job_id = await r.lpop(keys.rq_queue_key(tiers.routed_queue_name(MODEL, "flex", "w1")))  # w1 takes it
        queueing.routed_taken(fakeredis.FakeRedis(server=server), MODEL, job_id.decode(), "w1", "flex")
        return waiting, (await stats.queue_depths([MODEL]))[MODEL]

    waiting, taken = asyncio.run(go())
    assert waiting["flex"] == 1 and sum(waiting.values()) == 1
    assert sum(taken.values()) == 0


def test_a_key_has_at_most_routed_jobs_per_key_waiting_routed_at_once():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeAsyncRedis(server=server)
    first = chat(SYSTEM, Message("user", "Tell me about lighthouses."))
    pool(r, {"w1": [], "w2": [d for d, _ in prefixes(first)]}, {})
    router = Router(r, WorkerRegistry(r, 15), Routing(wait_s=1.0, min_chars=100, per_key=2))
    owned = keys.owned("alice", keys.OwnerIndex.ROUTED)

    def job(n: int) -> JobSpec:
        return JobSpec(id=f"chatcmpl-{n}", kind="chat", model=MODEL, messages=first.messages)

    async def go() -> list:
        got = []
        for n in range(3):
            route = await router.route(job(n), owner="alice")
            got.append(route and route.worker)
            if route:
                enqueue(server, job(n), route)
        got.append((await router.route(job(3), owner="bob")).worker)  # another key's own bound
        taken = (await r.zrange(keys.routed(MODEL), 0, -1))[0]  # w2 took one: its entry goes
        await r.zrem(keys.routed(MODEL), taken)
        got.append(await router.route(job(4), owner="alice"))  # taken moments ago: it may not be written yet
        await r.zadd(owned, {taken: int(time.time() * 1000) - 6000})
        got.append((await router.route(job(5), owner="alice")).worker)
        return got

    assert asyncio.run(go()) == ["w2", "w2", None, "w2", None, "w2"]
