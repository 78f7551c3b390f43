"""Many streams relayed over one reader connection, against a real Redis server."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from api.hub import StreamHub
from api.jobstore import JobStore
from api.relay import KEEPALIVE, follow
from api.services import shared_client
from contract import keys
from contract.entries import Delta, Finished, Started
from contract.servers import Servers
from contract.settings import Recovery
from devstack.processes import start_redis
from worker.claims import Claims
from worker.link import Link
from worker.publisher import Publisher

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


def test_hundreds_of_streams_over_one_reader_connection(redis_url):
    import redis as sync_redis

    async def scenario():
        client = shared_client(redis_url, 40, 5.0)
        sync = sync_redis.Redis.from_url(redis_url)
        store = JobStore(
            Servers(client, client),
            Servers(sync, sync),
            queue_wait_s=60,
            recovery=Recovery(job_ttl_s=600, retention_s=60),
        )
        hub = StreamHub(redis_url, client, block_ms=500)
        await hub.start()
        ids = [f"chatcmpl-hub{i}" for i in range(N_STREAMS)]
        for cid in ids:
            await client.hset(keys.job(cid), mapping={"status": "queued", "epoch": 0, "digest": DIGEST})

        async def consume(cid):
            got = []
            async for item in follow(store, hub, cid, keepalive_s=30):
                assert item is not KEEPALIVE
                got += [entry for _, entry in item]
            return got

        readers = [asyncio.create_task(consume(cid)) for cid in ids]
        await asyncio.sleep(0.5)
        assert hub.watched == N_STREAMS

        def produce():
            pub = Publisher(Link(sync, "w", RECOVERY))
            claims = Claims(Link(sync, "w", RECOVERY), 3000)
            attempts = [claims.claim(cid, DIGEST) for cid in ids]
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
                    clients_during.append(len(await client.client_list()))
                    await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample_connections())
        await asyncio.to_thread(produce)
        results = await asyncio.wait_for(asyncio.gather(*readers), timeout=60)
        sampler.cancel()
        await hub.stop()
        await client.aclose()
        return results, clients_during

    results, clients_during = asyncio.run(scenario())
    for got in results:
        assert isinstance(got[0], Started) and isinstance(got[-1], Finished)
        assert "".join(e.text for e in got if isinstance(e, Delta)) == "".join(
            f"t{t} " for t in range(N_TOKENS)
        )
    # 300 live streams never needed more than the reader + a bounded pool (+ producer, sampler)
    assert max(clients_during) <= 45, max(clients_during)
