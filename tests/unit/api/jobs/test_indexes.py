"""ShardIndexes on fakeredis (real Lua): every shard's running ids, and pending ids only when
asked and only those old enough."""

from __future__ import annotations

import asyncio

import fakeredis

from api.jobs.indexes import ShardIndexes
from contract import keys


def test_reads_every_shard_and_only_old_pending_ids_when_asked():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    running = [f"chatcmpl-run{i}" for i in range(40)]
    for job_id in running:
        r.zadd(keys.running(keys.shard(job_id)), {job_id: 1})
    r.zadd(keys.pending(keys.shard("chatcmpl-old")), {"chatcmpl-old": 100})
    r.zadd(keys.pending(keys.shard("chatcmpl-new")), {"chatcmpl-new": 300})
    indexes = ShardIndexes(fakeredis.FakeAsyncRedis(server=server))
    ids, pending = asyncio.run(indexes.read(200))
    assert sorted(ids) == sorted(running) and pending == ["chatcmpl-old"]
    assert asyncio.run(indexes.read())[1] == []
