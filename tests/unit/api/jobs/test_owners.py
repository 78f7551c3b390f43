"""api/jobs/owners.py: what one key's owner is counted and charged, on two fakeredis servers
(queues and streams) with the real ADMIT and SETTLE scripts: unfinished jobs, per-minute
budgets, Idempotency-Keys, and the cleanup of what an API that died between two steps left."""

from __future__ import annotations

import asyncio
import time

import pytest

from api.http.ratelimits import Budgets
from api.jobs.owners import RECORD_GRACE_MS, Idempotency, Owners, Quota
from contract import keys
from contract.entries import Delta, Failed, Finished, encode
from contract.keys import JobField
from tests.fake_servers import FakePair

TTL_S = 600
KEY = Idempotency(keys.idempotency("alice", "sha-of-the-header"), "digest-1")
MINUTE = 29_000_000  # a fixed minute since the epoch, for the tests that read its counters


def owners(server: FakePair, weight: float = 1.0) -> Owners:
    servers = server.aio()
    return Owners(servers.queues, servers.streams, TTL_S, cached_token_weight=weight)


def unfinished(server: FakePair, owner: str = "alice") -> list[str]:
    return [i.decode() for i in server.sync().queues.zrange(keys.owned(owner, keys.OwnerIndex.JOBS), 0, -1)]


@pytest.fixture
def this_minute(monkeypatch):
    """Time held still mid-minute: the counters a test reads are this minute's."""
    monkeypatch.setattr(time, "time", lambda: MINUTE * 60 + 30.0)


def test_without_limits_or_an_idempotency_key_nothing_is_counted():
    server = FakePair()
    o = owners(server)
    assert asyncio.run(o.admit("chatcmpl-1", "alice", None, Quota(), counted=True)) == [b"new", 0, 0]
    assert server.sync().queues.keys("*") == []


def test_without_keys_the_shared_owner_is_never_limited():
    """Every client is the owner "" without API keys: one shared count must not cap the server."""
    server = FakePair()
    o = owners(server)
    quota = Quota(unfinished_jobs=1, budgets=Budgets(requests_per_minute=1))

    async def go() -> list:
        return [await o.admit(f"chatcmpl-{i}", "", None, quota, counted=True) for i in range(3)]

    assert asyncio.run(go()) == [[b"new", 0, 0]] * 3
    assert server.sync().queues.keys("*") == []


def test_an_owner_at_its_most_unfinished_jobs_is_refused_with_the_count():
    server = FakePair()
    o = owners(server)
    quota = Quota(unfinished_jobs=2)

    async def go() -> list:
        return [await o.admit(f"chatcmpl-{i}", "alice", None, quota, counted=True) for i in range(3)]

    assert [reply[0] for reply in asyncio.run(go())] == [b"new", b"new", b"limit"]
    assert asyncio.run(o.admit("chatcmpl-9", "alice", None, quota, counted=True)) == [b"limit", 2]
    assert unfinished(server) == ["chatcmpl-0", "chatcmpl-1"]
    uncounted = asyncio.run(o.admit("chatcmpl-9", "alice", None, quota, counted=False))
    assert uncounted[0] == b"new" and unfinished(server) == ["chatcmpl-0", "chatcmpl-1"]


def test_a_request_rate_budget_refuses_the_request_over_it(this_minute):
    server = FakePair()
    o = owners(server)
    quota = Quota(budgets=Budgets(requests_per_minute=2))

    async def go() -> list:
        return [await o.admit(f"chatcmpl-{i}", "alice", None, quota, counted=True) for i in range(3)]

    assert asyncio.run(go()) == [[b"new", 1, 0], [b"new", 2, 0], [b"rate", b"requests", 2, 0]]
    assert server.sync().queues.get(keys.requests_per_minute("alice", MINUTE)) == b"2"


def test_a_retry_with_the_same_idempotency_key_finds_the_first_job():
    server = FakePair()
    o = owners(server)

    async def go() -> tuple:
        first = await o.admit("chatcmpl-1", "alice", KEY, Quota(), counted=True)
        again = await o.admit("chatcmpl-2", "alice", KEY, Quota(), counted=True)
        return first, again, await o.holding(KEY)

    first, again, (held, age_ms) = asyncio.run(go())
    assert first[0] == b"new" and again == [b"held", b"chatcmpl-1 digest-1"]
    assert held == "chatcmpl-1 digest-1" and 0 <= age_ms < 1000  # set a moment ago
    assert 0 < server.sync().queues.ttl(KEY.key) <= TTL_S


def test_an_unused_idempotency_key_holds_nothing():
    assert asyncio.run(owners(FakePair()).holding(KEY)) is None


def test_a_key_is_freed_only_while_it_still_holds_what_the_caller_saw():
    server = FakePair()
    o = owners(server)

    async def go() -> tuple:
        await o.admit("chatcmpl-1", "alice", KEY, Quota(), counted=True)
        await o.free(KEY, KEY.holding("chatcmpl-other"))  # another job's: kept
        kept = await o.holding(KEY)
        await o.free(KEY, KEY.holding("chatcmpl-1"))
        return kept, await o.holding(KEY)

    kept, freed = asyncio.run(go())
    assert kept[0] == "chatcmpl-1 digest-1" and freed is None


def test_take_back_undoes_an_admit_that_could_not_be_recorded():
    server = FakePair()
    o = owners(server)
    quota = Quota(unfinished_jobs=5)

    async def go() -> tuple:
        await o.admit("chatcmpl-1", "alice", None, quota, counted=True)
        await o.admit("chatcmpl-2", "alice", KEY, quota, counted=True)
        await o.take_back("chatcmpl-2", "alice", KEY)
        return await o.holding(KEY), await o.admit("chatcmpl-3", "alice", KEY, quota, counted=True)

    held, retried = asyncio.run(go())
    assert held is None and retried[0] == b"new"
    assert unfinished(server) == ["chatcmpl-1", "chatcmpl-3"]


def test_forget_ended_drops_ended_jobs_and_those_never_recorded_but_keeps_the_rest():
    server = FakePair()
    q, s = server.sync().queues, server.sync().streams
    now = int(time.time() * 1000)
    index = keys.owned("alice", keys.OwnerIndex.JOBS)
    q.zadd(
        index,
        {
            "ended": now - 60_000,
            "running": now - 60_000,
            "never-recorded": now - RECORD_GRACE_MS - 1000,  # its API died before RECORD
            "being-recorded": now - 100,  # RECORD may yet come
        },
    )
    s.hset(keys.job("ended"), mapping={JobField.STATUS: "done", JobField.ENDED: "1"})
    s.hset(keys.job("running"), mapping={JobField.STATUS: "running"})
    q.hset(keys.job("never-recorded"), JobField.STATUS, "running")  # the wrong server: not a record
    assert asyncio.run(owners(server).forget_ended("alice")) == 2
    assert sorted(unfinished(server)) == ["being-recorded", "running"]
    assert asyncio.run(owners(server).forget_ended("bob")) == 0


def test_a_finished_job_is_charged_its_usage_with_cached_tokens_weighed_once(this_minute):
    server = FakePair()
    o = owners(server, weight=0.5)
    quota = Quota(budgets=Budgets(tokens_per_minute=10_000), tokens=500, prompt_tokens=200)
    end = Finished(finish_reason="stop", prompt_tokens=100, completion_tokens=50, cached_tokens=40)

    async def go() -> tuple:
        admitted = await o.admit("chatcmpl-1", "alice", None, quota, counted=True)
        return (
            admitted,
            await o.settle("alice", "chatcmpl-1", end),
            await o.settle("alice", "chatcmpl-1", end),
        )

    admitted, charged, again = asyncio.run(go())
    assert admitted == [b"new", 0, 500]  # reserved: the prompt's bound and max_tokens
    assert (charged, again) == (60 + 20 + 50, -1)  # 60 uncached, 40 cached at half, 50 generated
    assert server.sync().queues.get(keys.tokens_per_minute("alice", MINUTE)) == b"130"


def test_more_cached_tokens_than_prompt_tokens_are_weighed_as_the_prompt(this_minute):
    o = owners(FakePair(), weight=0.0)
    quota = Quota(budgets=Budgets(tokens_per_minute=10_000), tokens=500, prompt_tokens=200)
    end = Finished(finish_reason="stop", prompt_tokens=100, completion_tokens=7, cached_tokens=150)

    async def go() -> int:
        await o.admit("chatcmpl-1", "alice", None, quota, counted=True)
        return await o.settle("alice", "chatcmpl-1", end)

    assert asyncio.run(go()) == 7  # the whole prompt cached, at no weight: only what was generated


@pytest.mark.parametrize(
    ("end", "charged"),
    [
        (Failed(message="boom", type="server_error", code="internal_error"), 200),  # the prompt's bound
        (None, 500),  # the job is gone: its whole reservation
    ],
)
def test_a_failed_or_gone_job_is_charged_from_its_reservation(this_minute, end, charged):
    o = owners(FakePair())
    quota = Quota(budgets=Budgets(tokens_per_minute=10_000), tokens=500, prompt_tokens=200)

    async def go() -> int:
        await o.admit("chatcmpl-1", "alice", None, quota, counted=True)
        return await o.settle("alice", "chatcmpl-1", end)

    assert asyncio.run(go()) == charged


def test_a_token_budget_refuses_a_reservation_that_would_pass_it(this_minute):
    o = owners(FakePair())
    budgets = Budgets(tokens_per_minute=1000)

    async def go() -> list:
        return [
            await o.admit("chatcmpl-1", "alice", None, Quota(budgets=budgets, tokens=600), counted=True),
            await o.admit("chatcmpl-2", "alice", None, Quota(budgets=budgets, tokens=401), counted=True),
            await o.admit("chatcmpl-3", "alice", None, Quota(budgets=budgets, tokens=400), counted=True),
        ]

    assert asyncio.run(go()) == [[b"new", 0, 600], [b"rate", b"tokens", 0, 600], [b"new", 0, 1000]]


def test_settle_ended_settles_the_jobs_that_ended_or_went_and_keeps_the_running(this_minute):
    server = FakePair()
    s = server.sync().streams
    o = owners(server)
    quota = Quota(budgets=Budgets(tokens_per_minute=10_000), tokens=100, prompt_tokens=40)
    for job_id in ("finished", "failed", "gone", "running"):
        asyncio.run(o.admit(job_id, "alice", None, quota, counted=True))
    for job_id in ("finished", "failed", "running"):
        s.hset(keys.job(job_id), JobField.STATUS, "running")
    s.xadd(
        keys.events("finished"), encode(Finished(finish_reason="stop", prompt_tokens=10, completion_tokens=5))
    )
    s.xadd(keys.events("failed"), encode(Failed(message="x", type="server_error", code="internal_error")))
    s.xadd(keys.events("running"), encode(Delta(text="hi", token_ids=(1,))))
    assert asyncio.run(o.settle_ended("alice")) == 3
    reserved = server.sync().queues.hgetall(keys.owned("alice", keys.OwnerIndex.RESERVED_TOKENS))
    assert list(reserved) == [b"running"]
    # 400 reserved; settled: 15 used, 40 (the failed prompt's bound), 100 (gone), and 100 still held
    assert server.sync().queues.get(keys.tokens_per_minute("alice", MINUTE)) == b"255"
    assert asyncio.run(o.settle_ended("nobody")) == 0
