"""api/ops/models.py: `/v1/models` lists each model once with its pools' live workers, and
`/scaling/<model>` adds a pool's queued and running jobs into the demand an autoscaler reads,
on fakeredis with real Lua."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import fakeredis
import pytest
from starlette.requests import Request

from api.cluster.figures import ClusterStats
from api.http.errors import APIError
from api.jobs.admission import Admission, OpenStreams
from api.jobs.memory import MemoryWatch
from api.jobs.workers import WorkerRegistry
from api.ops import models
from api.settings import Intake, Quotas
from contract import keys, tiers
from contract.keys import JobField
from contract.servers import Servers

STALE_S = 15.0


def services(r: fakeredis.FakeAsyncRedis, known: tuple[str, ...] = ()) -> SimpleNamespace:
    """The parts the handlers read, real ones on one fake server."""
    intake = Intake(known_models=known)
    registry = WorkerRegistry(r, STALE_S)
    admission = Admission(r, registry, OpenStreams(), MemoryWatch(r, 0.9), intake, Quotas())
    return SimpleNamespace(admission=admission, registry=registry, stats=ClusterStats(Servers(r, r)))


async def announce(r, pool: str, worker: str, slots: int = 4, age_s: float = 0.0) -> None:
    """A worker's announcement of `pool`, `age_s` seconds ago (worker/intake/presence.py)."""
    await r.sadd(keys.MODELS, pool)
    await r.zadd(keys.workers(pool), {worker: int((time.time() - age_s) * 1000)})
    await r.hset(keys.worker_slots(pool), worker, slots)


async def running(r, job_id: str, model: str, priority: str = "default") -> None:
    """An attempt in flight: the job in its shard's `running` index, its hash naming its model."""
    await r.zadd(keys.running(keys.shard(job_id)), {job_id: int(time.time() * 1000)})
    await r.hset(keys.job(job_id), mapping={JobField.MODEL: model, JobField.PRIORITY: priority})


def call(handler, svc, path_params: dict | None = None, query: bytes = b"") -> dict:
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": query}
    scope["state"] = {"services": svc}
    scope["path_params"] = path_params or {}
    return json.loads(asyncio.run(handler(Request(scope))).body)


def refusal(handler, svc, path_params: dict, query: bytes = b"") -> APIError:
    with pytest.raises(APIError) as exc:
        call(handler, svc, path_params, query)
    return exc.value


def test_a_model_is_listed_once_with_the_live_workers_of_each_of_its_pools():
    r = fakeredis.FakeAsyncRedis()

    async def seed() -> None:
        await announce(r, "m", "w1")
        await announce(r, "m", "w2")
        await announce(r, tiers.embedding_pool("m"), "e1")
        await announce(r, tiers.rank_pool("ranker"), "k1")
        await announce(r, tiers.rank_pool("ranker"), "k2")

    asyncio.run(seed())
    listed = call(models.list_models, services(r))
    assert listed["object"] == "list"
    by_id = {entry["id"]: entry for entry in listed["data"]}
    assert len(listed["data"]) == 2  # "m#embed" and "ranker#rank" are no models of their own
    assert by_id["m"] == {
        "id": "m",
        "object": "model",
        "created": 0,
        "owned_by": "tokenspool",
        "workers": 2,
        "embedding_workers": 1,
        "kinds": ["chat", "embeddings"],
    }
    assert by_id["ranker"]["workers"] == 0 and by_id["ranker"]["rerank_workers"] == 2
    assert by_id["ranker"]["kinds"] == ["rerank"]


def test_a_silent_worker_no_longer_counts_and_a_known_model_is_listed_without_any():
    r = fakeredis.FakeAsyncRedis()

    async def seed() -> None:
        await announce(r, "m", "fresh")
        await announce(r, "m", "silent", age_s=STALE_S + 5)
        await announce(r, "gone", "silent", age_s=STALE_S + 5)

    asyncio.run(seed())
    by_id = {e["id"]: e for e in call(models.list_models, services(r, known=("cold",)))["data"]}
    assert set(by_id) == {"m", "cold"}
    assert by_id["m"]["workers"] == 1
    assert (by_id["cold"]["workers"], by_id["cold"]["kinds"]) == (0, ["chat"])


def test_one_model_is_found_by_any_of_its_pools_and_an_unserved_one_is_a_404():
    r = fakeredis.FakeAsyncRedis()
    asyncio.run(announce(r, tiers.embedding_pool("org/embedder"), "e1"))
    svc = services(r)
    found = call(models.get_model, svc, {"model": "org/embedder"})
    assert (found["id"], found["kinds"], found["embedding_workers"]) == ("org/embedder", ["embeddings"], 1)
    assert found["workers"] == 0
    missing = refusal(models.get_model, svc, {"model": "nobody"})
    assert (missing.status, missing.code, missing.param) == (404, "model_not_found", "model")
    assert "'nobody'" in missing.message
    # a pool's own name is no model's name
    assert refusal(models.get_model, svc, {"model": "org/embedder#embed"}).status == 404


def test_scaling_adds_every_tier_s_queue_the_routed_jobs_and_the_attempts_running_into_demand():
    r = fakeredis.FakeAsyncRedis()

    async def seed() -> None:
        await announce(r, "m", "w1", slots=4)
        await announce(r, "m", "w2", slots=8)
        await announce(r, "m", "old", slots=100, age_s=STALE_S + 5)  # its slots are gone
        await r.rpush(keys.rq_queue_key(tiers.queue_name("m")), "a", "b")
        await r.rpush(keys.rq_queue_key(tiers.queue_name("m", "flex")), "c")
        await r.rpush(keys.rq_queue_key(tiers.queue_name("m", tiers.BATCH)), "d", "e", "f")
        await r.rpush(keys.rq_queue_key(tiers.suspect_queue_name("m")), "g")
        await r.zadd(keys.routed("m"), {tiers.routed_member("h", "w1", "priority"): 1})
        await r.rpush(keys.rq_queue_key(tiers.queue_name("other")), "x")  # another model's
        await running(r, "chatcmpl-1", "m")
        await running(r, "chatcmpl-2", "m", tiers.BATCH)
        await running(r, "chatcmpl-3", "m", tiers.BATCH)
        await running(r, "chatcmpl-4", "other")

    asyncio.run(seed())
    assert call(models.scaling, services(r), {"model": "m"}) == {
        "model": "m",
        "queued": 8,
        "in_flight": 3,
        "workers": 2,
        "slots": 12,
        "demand": 11,
        "batch_queued": 3,
        "batch_in_flight": 2,
        "interactive_demand": 6,
        "queued_by_tier": {"suspect": 1, "priority": 1, "default": 2, "flex": 1, "batch": 3},
    }


def test_scaling_from_zero_a_model_with_jobs_waiting_and_no_worker_is_not_a_404():
    r = fakeredis.FakeAsyncRedis()
    asyncio.run(r.rpush(keys.rq_queue_key(tiers.queue_name("cold")), "a"))
    got = call(models.scaling, services(r), {"model": "cold"})
    assert (got["workers"], got["slots"], got["queued"], got["demand"]) == (0, 0, 1, 1)
    known = call(models.scaling, services(fakeredis.FakeAsyncRedis(), known=("idle",)), {"model": "idle"})
    assert (known["workers"], known["demand"]) == (0, 0)
    nothing = refusal(models.scaling, services(fakeredis.FakeAsyncRedis()), {"model": "nobody"})
    assert (nothing.status, nothing.code) == (404, "model_not_found")


def test_scaling_by_kind_reads_the_model_s_embedding_or_rerank_pool_and_refuses_other_kinds():
    r = fakeredis.FakeAsyncRedis()

    async def seed() -> None:
        await announce(r, "m", "chat-worker", slots=2)
        await announce(r, tiers.embedding_pool("m"), "e1", slots=64)
        await r.rpush(keys.rq_queue_key(tiers.queue_name(tiers.embedding_pool("m"))), "a", "b")

    asyncio.run(seed())
    svc = services(r)
    embed = call(models.scaling, svc, {"model": "m"}, b"kind=embeddings")
    assert (embed["model"], embed["workers"], embed["slots"], embed["demand"]) == ("m#embed", 1, 64, 2)
    chat = call(models.scaling, svc, {"model": "m"}, b"kind=chat")
    assert (chat["model"], chat["slots"], chat["demand"]) == ("m", 2, 0)
    assert refusal(models.scaling, svc, {"model": "m"}, b"kind=rerank").status == 404  # no rerank pool
    bad = refusal(models.scaling, svc, {"model": "m"}, b"kind=images")
    assert (bad.status, bad.param) == (400, "kind")
