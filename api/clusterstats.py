"""Cluster-wide figures read from Redis: queue depths, attempts in flight, and the counters
workers add to `ts:stats`. The same on every API replica (for /metrics and /scaling)."""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aredis

from contract import keys
from contract.entries import as_text
from contract.keys import JobField


class ClusterStats:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client

    async def queue_depths(self, models: Sequence[str], batch: bool | None = None) -> dict[str, int]:
        """Model -> jobs waiting in its RQ queues (not yet taken by a worker): all of them, or
        only the Batch API's lines (`batch`), or only the rest."""
        names = {
            m: [n for n in keys.queue_names(m) if _wanted(n == keys.queue_name(m, keys.BATCH), batch)]
            for m in models
        }
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                for name in names[model]:
                    pipe.llen(keys.rq_queue_key(name))
            counts = iter(await pipe.execute())
        return {model: sum(int(next(counts)) for _ in names[model]) for model in models}

    async def in_flight(self, batch: bool | None = None) -> dict[str, int]:
        """Model -> attempts running now: all of them, or only Batch API lines, or the rest."""
        ids = await self._r.zrange(keys.RUNNING, 0, -1)
        if not ids:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.hmget(keys.job(as_text(cid)), [JobField.MODEL, JobField.PRIORITY])
            rows = await pipe.execute()
        out: dict[str, int] = {}
        for model, priority in rows:
            if model is not None and _wanted(priority == keys.BATCH.encode(), batch):
                out[as_text(model)] = out.get(as_text(model), 0) + 1
        return out

    async def counters(self) -> dict[str, int]:
        """The cluster-wide counters (contract.keys.STATS)."""
        return {as_text(k): int(v) for k, v in (await self._r.hgetall(keys.STATS)).items()}


def _wanted(is_batch: bool, batch: bool | None) -> bool:
    return batch is None or is_batch == batch
