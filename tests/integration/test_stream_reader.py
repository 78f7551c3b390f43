"""Many streams relayed over one reader connection, against a real Redis server, and over one
reader per shard against a real valkey cluster."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import pytest

from api.jobs.store import JobStore
from api.services import shared_client
from api.streaming.reader import StreamReader
from api.streaming.relay import KEEPALIVE, follow
from contract import keys
from contract.entries import Delta, Finished, Started
from contract.servers import Servers, async_cluster_client, sync_client
from contract.settings import Recovery
from devstack.cluster import start_cluster
from devstack.processes import start_redis
from worker.attempts.attempt import Claims
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)
DIGEST = "digest-of-the-spec"  # what the API records (contract.jobspec.digest)

pytestmark = pytest.mark.integration

N_STREAMS = 300
N_TOKENS = 20


@pytest.fixture
def redis_url(tmp_path):
    proc, url = start_redis(tmp_path)
    yield url
    proc.stop()


def test_hundreds_of_streams_over_one_reader_connection(redis_url, caplog):
    import redis as sync_redis

    client = shared_client(redis_url, 40, 5.0)
    results, clients_during = asyncio.run(
        relay(redis_url, client, sync_redis.Redis.from_url(redis_url), client.client_list)
    )
    check(results, caplog)
    # 300 live streams never needed more than the reader + a bounded pool (+ producer, sampler)
    assert max(clients_during) <= 45, max(clients_during)


def test_hundreds_of_streams_on_a_cluster_over_one_reader_per_shard(tmp_path, caplog):
    """The streams on a 3-primary valkey cluster: one XREAD per shard (a slot each), on the
    shard's node; the connections stay bounded by the shards and the pools."""
    import redis as sync_redis

    procs, url = start_cluster(tmp_path, masters=3)
    try:
        sync = sync_client(url)
        nodes = [sync_redis.Redis(port=n.port) for n in sync.get_primaries()]
        client = async_cluster_client(url, max_connections=10)

        async def connections() -> list:
            return [c for n in nodes for c in n.client_list()]

        results, clients_during = asyncio.run(relay(url, client, sync, connections))
        check(results, caplog)
        shards = len({keys.shard(f"chatcmpl-hub{i}") for i in range(N_STREAMS)})
        assert shards == keys.SHARDS
        # a reader per shard, the pools (10 per node) and the producer's and sampler's own
        assert max(clients_during) <= keys.SHARDS + 3 * 10 + 12, max(clients_during)
    finally:
        for p in procs:
            p.stop()


def check(results: list, caplog: pytest.LogCaptureFixture) -> None:
    # a reader that fails leaves each client to read for itself: slower, yet complete
    assert not [
        r.getMessage()
        for r in caplog.records
        if r.name == "api.streaming.reader" and r.levelno >= logging.WARNING
    ]
    for got in results:
        assert isinstance(got[0], Started) and isinstance(got[-1], Finished)
        assert "".join(e.text for e in got if isinstance(e, Delta)) == "".join(
            f"t{t} " for t in range(N_TOKENS)
        )


async def relay(url: str, client, sync, connections: Callable[[], Awaitable[list]]) -> tuple[list, list[int]]:
    """N_STREAMS streams of N_TOKENS tokens each, written by a publisher and followed through
    a StreamReader on `url`; returns what each follower got and the number of `connections`
    every 0.1 s meanwhile."""
    await client.initialize()  # a cluster client reads its slot map once, before the crowd
    store = JobStore(
        Servers(client, client),
        Servers(sync, sync),
        queue_wait_s=60,
        recovery=Recovery(job_ttl_s=600, retention_s=60),
    )
    reader = StreamReader(url, client, block_ms=500)
    await reader.start()
    ids = [f"chatcmpl-hub{i}" for i in range(N_STREAMS)]
    for job_id in ids:
        await client.hset(keys.job(job_id), mapping={"status": "queued", "epoch": 0, "digest": DIGEST})

    async def consume(job_id):
        got = []
        async for item in follow(store, reader, job_id, keepalive_s=30):
            assert item is not KEEPALIVE
            got += [entry for _, entry in item]
        return got

    readers = [asyncio.create_task(consume(job_id)) for job_id in ids]
    await asyncio.sleep(0.5)
    assert reader.watched == N_STREAMS

    def produce():
        pub = Publisher(Link(sync, "w", RECOVERY))
        claims = Claims(Link(sync, "w", RECOVERY), 3000)
        attempts = [claims.claim(job_id, DIGEST) for job_id in ids]
        for a in attempts:
            pub.started(a, 1)
        for t in range(N_TOKENS):
            for a in attempts:
                pub.delta(a, f"t{t} ", (t,))
        for a in attempts:
            pub.finished(a, "length", 1, N_TOKENS)

    clients_during = []

    async def sample_connections():
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                clients_during.append(len(await connections()))
                await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample_connections())
    await asyncio.to_thread(produce)
    results = await asyncio.wait_for(asyncio.gather(*readers), timeout=60)
    sampler.cancel()
    await reader.stop()
    await client.aclose()
    return results, clients_during
