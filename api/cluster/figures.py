"""Cluster-wide figures read from Redis, for /metrics and /scaling.

They are queue depths, attempts in flight, and the counters workers add to `ts:stats`. Every
API replica reads the same figures."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aredis

from api.jobs.indexes import ShardIndexes
from contract import keys, tiers
from contract.entries import as_text
from contract.keys import JobField
from contract.servers import Servers


class ClusterStats:
    def __init__(self, servers: Servers[aredis.Redis]) -> None:
        self._r = servers.queues
        self._streams = servers.streams
        self._indexes = ShardIndexes(servers.streams)

    async def queue_depths(self, models: Sequence[str]) -> dict[str, dict[str, int]]:
        """Model -> tier -> jobs waiting in its RQ queues, not yet taken by a worker. There is
        one count per tier (contract.tiers.PRIORITIES). It includes those routed to a
        worker's own queue (`keys.routed`). `suspect` counts the jobs whose worker died with
        them in its batch."""
        columns = (SUSPECT, *tiers.PRIORITIES)
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                # tiers.queue_names lists the suspect queue, then one per tier, in this order
                for name in tiers.queue_names(model):
                    pipe.llen(keys.rq_queue_key(name))
                pipe.zrange(keys.routed(model), 0, -1)
            counts = iter(await pipe.execute())
        out: dict[str, dict[str, int]] = {}
        for model in models:
            depths = out[model] = {tier: int(next(counts)) for tier in columns}
            for member in next(counts):
                depths[tiers.parse_routed_member(as_text(member))[2]] += 1
        return out

    async def in_flight(self, batch: bool | None = None) -> dict[str, int]:
        """Model -> attempts running now: all of them, or only Batch API lines, or the rest."""
        ids, _ = await self._indexes.read()
        if not ids:
            return {}
        async with self._streams.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(keys.job(job_id), [JobField.MODEL, JobField.PRIORITY])
            rows = await pipe.execute()
        out: dict[str, int] = {}
        for model, priority in rows:
            if model is not None and _wanted(priority == tiers.BATCH.encode(), batch):
                out[as_text(model)] = out.get(as_text(model), 0) + 1
        return out

    async def counters(self) -> dict[str, int]:
        """The cluster-wide counters (contract.keys.STATS)."""
        return {as_text(k): int(v) for k, v in (await self._r.hgetall(keys.STATS)).items()}


SUSPECT = "suspect"


def _wanted(is_batch: bool, batch: bool | None) -> bool:
    return batch is None or is_batch == batch
