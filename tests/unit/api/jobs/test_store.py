"""api.jobs.store.JobStore on fakeredis (two servers: queues and streams): what a job's record
keeps, and the per-key limits that ADMIT checks and counts in one step (a burst on several
replicas cannot overshoot them)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from api.endpoints.routes import reasoning_field
from api.http.ratelimits import Budgets
from api.jobs.owners import RECORD_GRACE_MS, OwnerLimit, OwnerRate, Quota, now_ms
from api.jobs.store import JobStore
from api.settings import Replies
from contract import keys, tiers
from contract.entries import Finished
from contract.jobspec import JobSpec, Message
from contract.keys import JobField
from contract.prefixes import cache_scope
from contract.servers import Servers
from contract.settings import Recovery
from tests.fake_servers import FakePair

RECOVERY = Recovery(job_ttl_s=600, retention_s=60)


def store(pair: FakePair) -> JobStore:
    return JobStore(pair.aio(), pair.sync(), queue_wait_s=60, recovery=RECOVERY)


def spec(n: int, content: str = "hi") -> JobSpec:
    return JobSpec(id=f"chatcmpl-{n}", kind="chat", model="m", messages=(Message("user", content),))


def submit_all(quota: Quota, n: int, owner: str = "alice") -> list:
    async def go() -> list:
        s = store(FakePair())
        return await asyncio.gather(
            *(s.submit(spec(i), "chat", 0, owner=owner, quota=quota) for i in range(n)),
            return_exceptions=True,
        )

    return asyncio.run(go())


def test_a_burst_cannot_overshoot_the_unfinished_jobs_limit():
    outcomes = submit_all(Quota(unfinished_jobs=3), 10)
    assert sum(not isinstance(o, Exception) for o in outcomes) == 3
    assert all(isinstance(o, OwnerLimit) for o in outcomes if isinstance(o, Exception))


def test_the_request_rate_and_byte_budget_per_minute():
    outcomes = submit_all(Quota(budgets=Budgets(requests_per_minute=4)), 6)
    assert [type(o).__name__ for o in outcomes].count("OwnerRate") == 2
    sent = 2 * stored(spec(0)) + 1  # each body is larger than what its job stores
    outcomes = submit_all(Quota(budgets=Budgets(bytes_per_minute=3 * sent + 1), request_bytes=sent), 5)
    refused = [o for o in outcomes if isinstance(o, OwnerRate)]
    assert len(refused) == 2 and all(o.what == "bytes" for o in refused)


def stored(job: JobSpec) -> int:
    """What a job's spec makes Redis keep: in its hash and in RQ's record."""
    return 2 * len(json.dumps(job.to_dict(), ensure_ascii=False).encode())


def test_a_small_request_is_charged_for_what_its_job_stores():
    """A 100-byte request whose job records far more (a response's history, issue 38) counts
    the record against the byte budget, not its body."""
    big = dataclasses.replace(spec(0, "x" * 10_000), cache_scope=cache_scope("o"))  # as submitted

    async def go() -> list:
        s = store(FakePair())
        quota = Quota(budgets=Budgets(bytes_per_minute=3 * stored(big)), request_bytes=100)
        return await asyncio.gather(
            *(s.submit(spec(i, "x" * 10_000), "chat", 0, owner="o", quota=quota) for i in range(5)),
            return_exceptions=True,
        )

    refused = [o for o in asyncio.run(go()) if isinstance(o, OwnerRate)]
    assert len(refused) == 2


def test_without_an_owner_there_is_no_per_key_limit():
    outcomes = submit_all(Quota(unfinished_jobs=1, budgets=Budgets(requests_per_minute=1)), 5, owner="")
    assert not any(isinstance(o, Exception) for o in outcomes)


def test_keep_says_when_a_client_attached_as_the_job_s_state_does():
    async def go() -> tuple[int, int, int]:
        s = store(FakePair())
        await s.submit(spec(1), "chat", 0)
        before = (await s.state("chatcmpl-1")).kept_at
        kept = await s.keep("chatcmpl-1")
        return before, kept, (await s.state("chatcmpl-1")).kept_at

    before, kept, state = asyncio.run(go())
    assert before == 0 and kept == state > 0  # the client that attached last sees nobody after it


def test_an_ended_job_keeps_only_what_resume_and_fetch_need():
    async def go(keep: bool) -> dict:
        pair = FakePair()
        s = store(pair)
        await s.submit(
            spec(1, "é" * 1000), "chat", 0, owner="alice", fields={JobField.KEEP_SPEC: "1"} if keep else {}
        )
        r = pair.sync().streams
        size = len(r.hget(keys.job("chatcmpl-1"), JobField.SPEC))
        assert size < 2 * 1000 + 500  # UTF-8, not \\u escapes (6 bytes a character)
        await s.end("chatcmpl-1", Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=0))
        assert 0 < r.ttl(keys.job("chatcmpl-1")) <= RECOVERY.retention_s
        return {k.decode(): v for k, v in r.hgetall(keys.job("chatcmpl-1")).items()}

    dropped = asyncio.run(go(keep=False))
    assert JobField.SPEC not in dropped and JobField.DIGEST not in dropped
    assert {JobField.MODEL, JobField.SURFACE, JobField.OWNER, JobField.STATUS, JobField.CREATED} <= set(
        dropped
    )
    kept = asyncio.run(go(keep=True))
    assert JobField.SPEC in kept  # an endpoint that shows the request later keeps it


@pytest.mark.parametrize("owner", ["", "alice"])
def test_a_job_is_pending_until_enqueued(owner):
    async def go() -> None:
        pair = FakePair()
        await store(pair).submit(spec(7), "chat", 0, owner=owner)
        servers = pair.sync()
        assert servers.streams.exists(keys.job("chatcmpl-7"))
        assert (
            servers.streams.zscore(keys.pending(keys.shard("chatcmpl-7")), "chatcmpl-7") is None
        )  # enqueued
        q = servers.queues
        assert q.lrange(keys.queue_key("m"), 0, -1) == [b"chatcmpl-7"] and q.llen(keys.wake("m")) == 1

    asyncio.run(go())


def test_an_ended_job_no_longer_counts_against_its_owner():
    async def go() -> None:
        pair = FakePair()
        s = store(pair)
        quota = Quota(unfinished_jobs=2)
        await s.submit(spec(1), "chat", 0, owner="alice", quota=quota)
        await s.submit(spec(2), "chat", 0, owner="alice", quota=quota)
        with pytest.raises(OwnerLimit):
            await s.submit(spec(3), "chat", 0, owner="alice", quota=quota)
        await s.end("chatcmpl-1", Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=0))
        await s.submit(spec(3), "chat", 0, owner="alice", quota=quota)  # 1 ended: it went at the limit
        held = pair.sync().queues.zrange(keys.owned("alice", keys.OwnerIndex.JOBS), 0, -1)
        assert sorted(held) == [b"chatcmpl-2", b"chatcmpl-3"]
        with pytest.raises(OwnerLimit):
            await s.submit(spec(4), "chat", 0, owner="alice", quota=quota)

    asyncio.run(go())


def test_a_job_admitted_but_never_recorded_stops_counting_after_the_grace():
    """Its API died between ADMIT (queues server) and RECORD (streams server)."""

    async def go() -> None:
        pair = FakePair()
        s = store(pair)
        quota = Quota(unfinished_jobs=1)
        index = keys.owned("alice", keys.OwnerIndex.JOBS)
        pair.sync().queues.zadd(index, {"chatcmpl-fresh": now_ms()})
        with pytest.raises(OwnerLimit):  # it may be on its way to its record
            await s.submit(spec(1), "chat", 0, owner="alice", quota=quota)
        pair.sync().queues.zadd(index, {"chatcmpl-fresh": now_ms() - RECORD_GRACE_MS - 1})
        await s.submit(spec(1), "chat", 0, owner="alice", quota=quota)
        assert pair.sync().queues.zrange(index, 0, -1) == [b"chatcmpl-1"]

    asyncio.run(go())


def test_a_job_the_streams_server_could_not_record_is_taken_back_from_its_owner():
    from redis.exceptions import ConnectionError as RedisConnectionError

    from api.jobs.owners import Idempotency

    async def go() -> None:
        pair = FakePair()
        s = store(pair)
        pair.streams.connected = False  # the streams server is gone; the queues server answers
        idem = Idempotency(keys.idempotency("alice", "k"), "digest")
        with pytest.raises(RedisConnectionError):
            await s.submit(
                spec(1), "chat", 0, owner="alice", quota=Quota(unfinished_jobs=1), idempotency=idem
            )
        q = pair.sync().queues
        assert q.zcard(keys.owned("alice", keys.OwnerIndex.JOBS)) == 0 and not q.exists(idem.key)
        assert not q.llen(keys.queue_key("m"))  # nothing enqueued
        pair.streams.connected = True
        await s.submit(spec(2), "chat", 0, owner="alice", quota=Quota(unfinished_jobs=1), idempotency=idem)

    asyncio.run(go())


def test_on_one_server_a_job_leaves_pending_with_its_enqueue():
    import fakeredis

    async def go() -> None:
        server = fakeredis.FakeServer()
        one = fakeredis.FakeAsyncRedis(server=server)
        sync = fakeredis.FakeRedis(server=server)
        s = JobStore(Servers(one, one), Servers(sync, sync), queue_wait_s=60, recovery=RECOVERY)
        await s.submit(spec(8), "chat", 0)
        assert sync.zcard(keys.pending(keys.shard("chatcmpl-8"))) == 0
        assert sync.lrange(keys.queue_key("m"), 0, -1) == [b"chatcmpl-8"]

    asyncio.run(go())


def test_a_request_without_limits_or_key_is_admitted_without_a_round_trip():
    async def go() -> None:
        pair = FakePair()
        s = store(pair)
        calls = []

        async def admit(**kw):
            calls.append(kw)
            return [b"new", 1, 0]

        s.owners._admit = admit
        await s.submit(spec(9), "chat", 0)  # no owner (no keys), no Idempotency-Key
        await s.submit(spec(10), "chat", 0, owner="alice", quota=Quota())  # an owner without limits
        assert calls == []
        await s.submit(
            spec(11), "chat", 0, owner="alice", quota=Quota(budgets=Budgets(requests_per_minute=5))
        )
        assert len(calls) == 1

    asyncio.run(go())


def test_a_connection_found_gone_after_another_client_attached_cancels_nothing():
    """Found by the chaos campaign: a POST answered late (its client gave up and retried with
    its Idempotency-Key) was found gone after the retry attached, and its disconnect
    cancelled the job under the retry's stream."""
    pair = FakePair()

    async def go() -> tuple[bytes | None, bytes | None]:
        jobs = store(pair)
        job = (await jobs.submit(spec(1), "chat", 0)).job
        first_arrived = now_ms() - 1_000  # the first request came a second ago...
        await jobs.keep(job.id)  # ...its retry attached since
        await jobs.cancel(job.id, 30.0, arrived_ms=first_arrived)  # the first one is found gone
        kept = await pair.aio().streams.hget(keys.job(job.id), JobField.CANCEL_AT)
        await jobs.cancel(job.id, 30.0, arrived_ms=now_ms() + 1)  # the retry goes too
        return kept, await pair.aio().streams.hget(keys.job(job.id), JobField.CANCEL_AT)

    first, retry = asyncio.run(go())
    assert first is None and retry is not None


class _Confirms:
    """One server's confirmations, scripted: `lose` runs at the first (a failover that took
    that server's last writes with it), which then fails; later ones succeed."""

    def __init__(self, lose=None) -> None:
        self.lose, self.calls = lose, 0

    async def settled(self, key: str | None = None) -> bool:
        self.calls += 1
        if self.calls == 1 and self.lose is not None:
            self.lose()
            return False
        return True


def _queued(pair: FakePair, job: JobSpec) -> list[bytes]:
    queue = keys.rq_queue_key(tiers.queue_name("m", "default"))
    return pair.sync().queues.lrange(queue, 0, -1)


@pytest.mark.parametrize("lost", [True, False])
def test_split_servers_a_queue_entry_a_failover_lost_is_queued_again(lost):
    """Two servers: the queues server fails over without the new job's queue entry (and RQ's
    record), while the streams server keeps the job, its pending mark already cleared. The
    entry is put back before the API answers; one a failover did not lose is not doubled."""
    pair = FakePair()
    rq = pair.sync()
    job = spec(1)

    def promoted_without_the_tail() -> None:
        if lost:
            rq.queues.flushall()

    acks = Servers(queues=_Confirms(promoted_without_the_tail), streams=_Confirms())
    s = JobStore(pair.aio(), rq, queue_wait_s=60, recovery=RECOVERY, acks=acks)  # type: ignore[arg-type]
    asyncio.run(s.submit(job, "chat", 0))
    assert _queued(pair, job) == [keys.rq_job_id(job.id, 0).encode()]
    assert rq.queues.exists(keys.rq_job(keys.rq_job_id(job.id, 0)))
    assert rq.streams.zcard(keys.pending(keys.shard(job.id))) == 0


def test_a_chat_job_keeps_the_thinking_field_it_was_created_with():
    async def go() -> tuple:
        s = store(FakePair())
        await s.submit(spec(1), "chat", 0, fields=reasoning_field(Replies()))
        await s.submit(spec(2), "chat", 0, fields=reasoning_field(Replies(reasoning_field="both")))
        return await s.state("chatcmpl-1"), await s.state("chatcmpl-2")

    default, both = asyncio.run(go())
    assert default is not None and default.reasoning_field == "reasoning_content"
    assert both is not None and both.reasoning_field == "both"


def test_a_key_short_of_tokens_is_first_charged_what_its_ended_jobs_used():
    """Their ends were never read (the clients went away): the next job that finds the key
    short settles them before it is refused."""

    async def go() -> None:
        pair = FakePair()
        s = store(pair)
        quota = Quota(budgets=Budgets(tokens_per_minute=100), tokens=60, prompt_tokens=10)
        await s.submit(spec(1), "chat", 0, owner="alice", quota=quota)
        running = await s.submit(
            spec(2), "chat", 0, owner="alice", quota=dataclasses.replace(quota, tokens=20)
        )
        with pytest.raises(OwnerRate) as refused:
            await s.submit(spec(3), "chat", 0, owner="alice", quota=quota)
        assert refused.value.what == "tokens" and refused.value.tokens == 80
        await s.end("chatcmpl-1", Finished(finish_reason="stop", prompt_tokens=12, completion_tokens=8))
        admitted = await s.submit(spec(3), "chat", 0, owner="alice", quota=quota)
        assert admitted.spent is not None and admitted.spent.tokens == 20 + 20 + 60
        held = pair.sync().queues.hgetall(keys.owned("alice", keys.OwnerIndex.RESERVED_TOKENS))
        assert set(held) == {running.job.id.encode(), b"chatcmpl-3"}  # the running job still holds its own
        assert await s.owners.settle("alice", "chatcmpl-1", None) == -1  # settled once

    asyncio.run(go())


def test_a_job_starting_with_a_public_prompt_is_marked_so_where_keys_keep_caches_apart():
    from contract.prefixes import public_digest

    async def go() -> list[bool]:
        pair = FakePair()
        s = JobStore(
            pair.aio(),
            pair.sync(),
            queue_wait_s=60,
            recovery=RECOVERY,
            public_prompts=frozenset({public_digest("P")}),
        )
        public, private = (Message("system", "P"), Message("user", "hi")), (Message("system", "Q"),)
        for n, (messages, owner) in enumerate(((public, "alice"), (private, "alice"), (public, ""))):
            await s.submit(dataclasses.replace(spec(n), messages=messages), "chat", 0, owner=owner)
        r = pair.sync().streams
        return [
            json.loads(r.hget(keys.job(f"chatcmpl-{n}"), JobField.SPEC)).get("public_prompt", False)
            for n in range(3)
        ]

    assert asyncio.run(go()) == [True, False, False]  # without keys there is one cache anyway


def test_last_id_is_the_newest_entry_of_the_jobs_stream():
    pair = FakePair()

    async def go() -> tuple[str | None, str | None]:
        s = store(pair)
        before = await s.last_id("chatcmpl-1")
        for entry_id in ("5-0", "5-1", "7-0"):
            pair.sync().streams.xadd(keys.events("chatcmpl-1"), {"x": "1"}, id=entry_id)
        return before, await s.last_id("chatcmpl-1")

    assert asyncio.run(go()) == (None, "7-0")
