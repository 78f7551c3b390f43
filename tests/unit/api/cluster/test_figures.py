"""api/cluster/figures.py: ClusterStats' queue depths, attempts in flight and counters, read on
fakeredis from two servers (queues and streams, as with STREAMS_REDIS_URL)."""

from __future__ import annotations

import asyncio

from api.cluster.figures import ClusterStats
from contract import keys, tiers
from contract.keys import JobField
from tests.fake_servers import FakePair

ZEROS = {"suspect": 0, "priority": 0, "default": 0, "flex": 0, "batch": 0}


def waiting(server: FakePair, queue: str, *rq_ids: str) -> None:
    server.sync().queues.rpush(keys.rq_queue_key(queue), *rq_ids)


def routed(server: FakePair, model: str, rq_id: str, worker: str, priority: str) -> None:
    server.sync().queues.zadd(keys.routed(model), {tiers.routed_member(rq_id, worker, priority): 10**13})


def running(server: FakePair, job_id: str, model: str | None, priority: str = "default") -> None:
    """A running attempt: in its shard's running index, with its hash (none if `model` is None)."""
    r = server.sync().streams
    r.zadd(keys.running(keys.shard(job_id)), {job_id: 1})
    if model is not None:
        r.hset(keys.job(job_id), mapping={JobField.MODEL: model, JobField.PRIORITY: priority})


def test_each_tier_s_queue_and_the_suspects_are_counted_apart_per_model():
    server = FakePair()
    waiting(server, tiers.queue_name("m", "default"), "a", "b", "c")
    waiting(server, tiers.queue_name("m", "priority"), "d")
    waiting(server, tiers.queue_name("m", "batch"), "e", "f")
    waiting(server, tiers.suspect_queue_name("m"), "g")
    waiting(server, tiers.queue_name("n", "flex"), "h")
    stats = ClusterStats(server.aio())
    assert asyncio.run(stats.queue_depths(["m", "n", "idle"])) == {
        "m": {"suspect": 1, "priority": 1, "default": 3, "flex": 0, "batch": 2},
        "n": {**ZEROS, "flex": 1},
        "idle": ZEROS,
    }


def test_jobs_routed_to_a_worker_count_in_their_own_tier_s_depth():
    server = FakePair()
    waiting(server, tiers.queue_name("m", "flex"), "a")
    routed(server, "m", "b", "w1", "flex")
    routed(server, "m", "c", "w2", "priority")
    routed(server, "m", "d", "w1", "priority")
    routed(server, "n", "e", "w3", "default")
    depths = asyncio.run(ClusterStats(server.aio()).queue_depths(["m"]))
    assert depths == {"m": {**ZEROS, "flex": 2, "priority": 2}}


def test_no_models_no_depths():
    assert asyncio.run(ClusterStats(FakePair().aio()).queue_depths([])) == {}


def test_attempts_in_flight_are_counted_per_model_batch_lines_apart():
    server = FakePair()
    running(server, "chatcmpl-1", "m")
    running(server, "chatcmpl-2", "m", "flex")
    running(server, "batch-3", "m", "batch")
    running(server, "chatcmpl-4", "n", "priority")
    running(server, "chatcmpl-5", None)  # its hash gone (expired): no model to count it under
    stats = ClusterStats(server.aio())

    async def go() -> tuple[dict, dict, dict]:
        return await stats.in_flight(), await stats.in_flight(batch=True), await stats.in_flight(batch=False)

    everything, batch, interactive = asyncio.run(go())
    assert everything == {"m": 3, "n": 1}
    assert batch == {"m": 1}
    assert interactive == {"m": 2, "n": 1}


def test_nothing_running_is_nothing_in_flight():
    server = FakePair()
    server.sync().streams.hset(keys.job("chatcmpl-1"), mapping={JobField.MODEL: "m"})  # queued, not running
    assert asyncio.run(ClusterStats(server.aio()).in_flight()) == {}


def test_the_counters_are_the_stats_hash_as_integers():
    server = FakePair()
    server.sync().queues.hset(keys.STATS, mapping={"jobs_done": 12, "tokens_generated": 3400})
    server.sync().streams.hset(keys.STATS, mapping={"jobs_done": 99})  # the wrong server: not read
    assert asyncio.run(ClusterStats(server.aio()).counters()) == {"jobs_done": 12, "tokens_generated": 3400}


def test_no_counters_yet_is_an_empty_dict():
    assert asyncio.run(ClusterStats(FakePair().aio()).counters()) == {}
