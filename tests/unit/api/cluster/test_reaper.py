"""The reaper's judgements on fakeredis (two servers, queues and streams, as with
STREAMS_REDIS_URL): whom a worker's death is charged to, and the jobs it puts back (a dead
worker's inbox, jobs whose enqueuer died)."""

from __future__ import annotations

import asyncio
import json

import fakeredis
import pytest

from api.cluster.reaper import Reaper
from api.jobs.routing import Router
from api.jobs.store import JobStore
from api.jobs.workers import WorkerRegistry
from api.pool_settings import Routing
from contract import keys, tiers
from contract.jobspec import JobSpec, Message, digest
from contract.keys import JobField, JobStatus
from contract.settings import Recovery
from tests.fake_servers import FakePair
from worker.attempts.attempt import Attempt, Claims
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(max_attempts=2, retention_s=60)


@pytest.fixture
def server():
    return FakePair()


def spec(job_id: str) -> dict:
    return JobSpec(id=job_id, kind="chat", model="m", messages=(Message("user", "hi"),)).to_dict()


def queued(r, job_id: str, **fields) -> None:
    """A job as the API records it."""
    raw = spec(job_id)
    mapping = {
        JobField.MODEL: "m",
        JobField.STATUS: JobStatus.QUEUED,
        JobField.EPOCH: 0,
        JobField.ATTEMPTS: 0,
        JobField.SPEC: json.dumps(raw),
        JobField.DIGEST: digest(raw),
        **fields,
    }
    r.hset(keys.job(job_id), mapping=mapping)


def link(server: FakePair, worker: str) -> Link:
    servers = server.sync()
    return Link(servers.queues, worker, RECOVERY, streams_client=servers.streams)


def running_on(server: FakePair, worker: str, cids: list[str], record: bool = True) -> dict[str, Attempt]:
    """The jobs claimed by `worker` (recorded first, or requeued ones taken again)."""
    r = server.sync().streams
    claims = Claims(link(server, worker), 3000)
    out = {}
    for job_id in cids:
        if record:
            queued(r, job_id)
        out[job_id] = claims.claim(job_id, digest(spec(job_id)))
    return out


def reap(server, connected: set[str]) -> int:
    async def go() -> int:
        servers = server.aio()
        store = JobStore(servers, server.sync(), queue_wait_s=60, recovery=RECOVERY)
        registry = WorkerRegistry(servers.queues, 15)
        router = Router(servers.queues, registry, Routing())
        reaper = Reaper(servers, store, registry, router, interval_s=0.5, settle_s=0)
        survey = await store.survey(3000)
        taken = await reaper._judge(survey.running, connected)
        await reaper._return_inboxes(connected)
        await reaper._route_back(connected)
        await reaper._enqueue_pending(survey.pending)
        return taken

    return asyncio.run(go())


def field(r, job_id: str, name: str) -> bytes | None:
    return r.hget(keys.job(job_id), name)


def went_on(server: FakePair, attempt: Attempt, tokens: int = RECOVERY.suspect_tokens) -> None:
    """The attempt wrote its Started entry and `tokens` tokens."""
    pub = Publisher(link(server, attempt.worker))
    pub.started(attempt, 3)
    for t in range(tokens):
        pub.delta(attempt, "x", (t,))
    pub.flush(attempt)


def test_a_batch_that_dies_standing_still_charges_nobody_and_isolates_nobody_yet(server):
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    batch = ["chatcmpl-a", "chatcmpl-b", "chatcmpl-c"]
    running_on(server, "w1", batch)
    assert reap(server, connected=set()) == 3
    for job_id in batch:
        assert field(r, job_id, JobField.STATUS) == b"queued" and field(r, job_id, JobField.CHARGED) is None
        assert field(r, job_id, JobField.SUSPECT) is None and field(r, job_id, JobField.STALLS) == b"1"
    assert not q.llen(keys.rq_queue_key(tiers.suspect_queue_name("m")))  # any worker reads them again at once
    # they stand still at a second death in a row, of another batch: suspects, still uncharged
    running_on(server, "w2", ["chatcmpl-d"], record=True)
    running_on(server, "w2", batch, record=False)
    reap(server, connected=set())
    for job_id in batch:
        assert field(r, job_id, JobField.SUSPECT) == b"1" and field(r, job_id, JobField.CHARGED) is None
    assert field(r, "chatcmpl-d", JobField.SUSPECT) is None  # its first stall
    suspects = q.lrange(keys.rq_queue_key(tiers.suspect_queue_name("m")), 0, -1)
    assert sorted(suspects) == [b"chatcmpl-a__a4", b"chatcmpl-b__a4", b"chatcmpl-c__a4"]


def test_jobs_that_went_on_before_their_worker_died_are_requeued_clear(server):
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    attempts = running_on(server, "w1", ["chatcmpl-a", "chatcmpl-b"])
    went_on(server, attempts["chatcmpl-a"])
    went_on(server, attempts["chatcmpl-b"], tokens=RECOVERY.suspect_tokens - 1)
    reap(server, connected=set())
    assert r.hmget(keys.job("chatcmpl-a"), JobField.STALLS, JobField.SUSPECT, JobField.REQUEUES) == [None] * 3
    assert r.hmget(keys.job("chatcmpl-b"), JobField.STALLS, JobField.REQUEUES) == [b"1", b"1"]
    assert not q.llen(keys.rq_queue_key(tiers.suspect_queue_name("m")))


def test_a_death_with_a_suspect_is_the_suspect_s_alone(server):
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    queued(r, "chatcmpl-s", **{JobField.SUSPECT: "1"})
    Claims(link(server, "w1"), 3000).claim("chatcmpl-s", digest(spec("chatcmpl-s")))
    running_on(server, "w1", ["chatcmpl-x", "chatcmpl-y"])
    reap(server, connected=set())
    assert field(r, "chatcmpl-s", JobField.CHARGED) == b"1"
    for bystander in ("chatcmpl-x", "chatcmpl-y"):
        assert field(r, bystander, JobField.CHARGED) is None and field(r, bystander, JobField.SUSPECT) is None
    continuations = keys.rq_queue_key(tiers.queue_name("m", tiers.PRIORITIES[0]))
    assert q.lrange(continuations, 0, -1) and q.lrange(
        keys.rq_queue_key(tiers.suspect_queue_name("m")), 0, -1
    )


def test_a_death_among_suspects_stepping_together_halves_their_group_and_charges_none(server):
    """Group testing: the worker's three suspects stepped as one group; any of them (or none:
    a kill from outside) may have killed it, so none is charged, and each waits to step in a
    group of two at most (its RQ record says so, for TAKE). The bystander waited them out."""
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    group = ["chatcmpl-s1", "chatcmpl-s2", "chatcmpl-s3"]
    for job_id in group:
        queued(r, job_id, **{JobField.SUSPECT: "1", JobField.GROUP: "0"})
    running_on(server, "w1", group, record=False)
    running_on(server, "w1", ["chatcmpl-x"])
    assert reap(server, connected=set()) == 4
    for job_id in group:
        assert field(r, job_id, JobField.CHARGED) is None and field(r, job_id, JobField.SUSPECT) == b"1"
        assert field(r, job_id, JobField.GROUP) == b"2"
        assert q.hget(keys.rq_job(keys.rq_job_id(job_id, 2)), JobField.GROUP) == b"2"
    assert field(r, "chatcmpl-x", JobField.STALLS) is None  # the suspects' death, not its own
    # the next death of two of them, together: each steps alone after
    running_on(server, "w2", group[:2], record=False)
    reap(server, connected=set())
    assert [field(r, j, JobField.GROUP) for j in group] == [b"1", b"1", b"2"]
    assert all(field(r, j, JobField.CHARGED) is None for j in group)
    running_on(server, "w3", group[:1], record=False)  # alone now: its death is its own
    reap(server, connected=set())
    assert field(r, group[0], JobField.CHARGED) == b"1"


def test_a_job_alone_in_its_worker_is_charged_and_lost_after_max_attempts(server):
    r = fakeredis.FakeRedis(server=server.streams)
    running_on(server, "w1", ["chatcmpl-p"])
    reap(server, connected=set())
    assert (
        field(r, "chatcmpl-p", JobField.CHARGED) == b"1"
        and field(r, "chatcmpl-p", JobField.STATUS) == b"queued"
    )
    assert field(r, "chatcmpl-p", JobField.SUSPECT) == b"1"  # it proves itself before it is uncharged
    Claims(link(server, "w2"), 3000).claim("chatcmpl-p", digest(spec("chatcmpl-p")))
    reap(server, connected={"w1"})  # w2 is gone too
    assert field(r, "chatcmpl-p", JobField.STATUS) == b"failed"  # MAX_ATTEMPTS=2 charged deaths


@pytest.mark.parametrize("mates_go_on", [True, False], ids=["mates going on", "mates standing still"])
def test_a_poison_job_ends_as_worker_lost_and_its_batch_mates_survive(server, mates_go_on):
    """A job that kills every worker it lands on, batched with others each time: its mates go
    on a few tokens before each death, or (a poison that kills as its prompt is read beside
    theirs) stand still with it, and become suspects too, in its groups, never charged."""
    r = fakeredis.FakeRedis(server=server.streams)
    poison, mates = "chatcmpl-poison", [f"chatcmpl-m{i}" for i in range(6)]
    for job_id in (poison, *mates):
        queued(r, job_id)
    workers = iter(range(100))
    deaths = 0

    def suspect(job_id: str) -> bool:
        return field(r, job_id, JobField.SUSPECT) == b"1"

    def fits(batch: list[str]) -> bool:
        """Its suspects make a group no larger than any of them may step in (TAKE's rule)."""
        caps = [int(field(r, j, JobField.GROUP) or 0) for j in batch if suspect(j)]
        return not any(caps) or len(caps) <= min(c for c in caps if c)

    while field(r, poison, JobField.STATUS) != b"failed" and deaths < 20:
        # the poison's next worker runs two more jobs, suspects or not, as TAKE gives them
        worker = f"w{next(workers)}"
        claims = Claims(link(server, worker), 3000)
        batch = [poison]
        for m in mates:
            if len(batch) < 3 and field(r, m, JobField.STATUS) == b"queued" and fits([*batch, m]):
                batch.append(m)
        for job_id in batch:
            epoch = int(field(r, job_id, JobField.EPOCH))
            r.zrem(keys.pending(keys.shard(job_id)), job_id)
            attempt = claims.claim(job_id, digest(spec(job_id)))
            assert int(field(r, job_id, JobField.EPOCH)) == epoch + 1
            if mates_go_on and job_id != poison:
                went_on(server, attempt)
        reap(server, connected=set())
        deaths += 1
    assert field(r, poison, JobField.STATUS) == b"failed"
    # two stalls in batches, groups of 3 then 2 suspects (ceil(log2(3)) deaths), then alone
    assert deaths <= 2 + 2 + RECOVERY.max_attempts
    last = r.xrevrange(keys.events(poison), count=1)[0][1]
    assert last[b"c"] == b"worker_lost"
    assert all(field(r, m, JobField.CHARGED) is None for m in mates)  # no bystander was charged
    if mates_go_on:
        assert all(field(r, m, JobField.SUSPECT) is None for m in mates)


def test_a_dead_worker_s_inbox_goes_back_to_the_queue(server):
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    q.sadd(keys.MODELS, "m")
    q.zadd(keys.workers("m"), {"w-dead": 1})
    queued(r, "chatcmpl-q")
    running_on(server, "w-other", ["chatcmpl-r"])
    q.hset(keys.inbox("w-dead"), mapping={"chatcmpl-q": 1, "chatcmpl-r": 1, "chatcmpl-old__a3": 1})
    reap(server, connected={"w-other"})
    assert q.lrange(keys.queue_key("m"), 0, -1) == [b"chatcmpl-q"]  # the queued one, only
    assert not q.exists(keys.inbox("w-dead"))


def test_a_job_left_pending_by_a_dead_enqueuer_is_enqueued(server):
    r, q = fakeredis.FakeRedis(server=server.streams), fakeredis.FakeRedis(server=server.queues)
    queued(r, "chatcmpl-orphan")
    queued(r, "chatcmpl-fresh")
    r.zadd(keys.pending(keys.shard("chatcmpl-orphan")), {"chatcmpl-orphan": 1})
    r.zadd(keys.pending(keys.shard("chatcmpl-fresh")), {"chatcmpl-fresh": 10**13})
    reap(server, connected=set())
    assert q.lrange(keys.queue_key("m"), 0, -1) == [b"chatcmpl-orphan"]
    assert r.zscore(keys.pending(keys.shard("chatcmpl-orphan")), "chatcmpl-orphan") is None
    assert r.zscore(keys.pending(keys.shard("chatcmpl-fresh")), "chatcmpl-fresh")
    assert q.llen(keys.wake("m")) == 1


def test_a_dead_worker_s_routed_jobs_go_back_and_its_claims_and_rq_registry_go(server):
    q = fakeredis.FakeRedis(server=server.queues)
    q.sadd(keys.MODELS, "m")
    q.zadd(keys.workers("m"), {"w-dead": 1})
    routed = tiers.routed_queue_name("m", "default", "w-dead")
    q.rpush(keys.rq_queue_key(routed), "chatcmpl-z")
    q.zadd(keys.routed("m"), {tiers.routed_member("chatcmpl-z", "w-dead", "default"): 10**13})  # not due
    q.sadd(keys.held_prefixes("w-dead"), "d1")
    q.sadd(keys.rq_queue_workers_key(routed), "rq:worker:w-dead")
    reap(server, connected=set())
    assert q.lrange(keys.queue_key("m"), 0, -1) == [b"chatcmpl-z"]  # at once, before its deadline
    assert not q.exists(keys.held_prefixes("w-dead"), keys.rq_queue_workers_key(routed), keys.routed("m"))


def test_nothing_is_judged_for_a_while_after_a_server_changes(server, monkeypatch):
    """A failover promotes a replica that has run for long: its uptime says nothing, its run
    id does. The workers reconnect and write again what it lost before anyone is judged."""
    infos = {"run_id": "a", "uptime_in_seconds": 1000}

    async def node_infos(client, section):
        return [dict(infos)]

    monkeypatch.setattr("api.cluster.reaper.node_infos", node_infos)

    async def go() -> list[bool]:
        servers = server.aio()
        store = JobStore(servers, server.sync(), queue_wait_s=60, recovery=RECOVERY)
        registry = WorkerRegistry(servers.queues, 15)
        reaper = Reaper(servers, store, registry, Router(servers.queues, registry, Routing()), 0.5, 30)
        assert not await reaper._settled()  # a first look cannot tell whether it just changed
        reaper._quiet_until = 0.0
        seen = [await reaper._settled()]
        infos["run_id"] = "b"  # promoted
        seen += [await reaper._settled(), await reaper._settled()]
        infos["uptime_in_seconds"] = 3  # a restart
        seen.append(await reaper._settled())
        return seen

    assert asyncio.run(go()) == [True, False, False, False]
