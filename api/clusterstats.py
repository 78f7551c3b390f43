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

    async def queue_depths(self, models: Sequence[str]) -> dict[str, int]:
        """Model -> jobs waiting in its RQ queues (not yet taken by a worker)."""
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                for queue in keys.queue_keys(model):
                    pipe.llen(queue)
            counts = iter(await pipe.execute())
        per_model = len(keys.queue_names(""))
        return {model: sum(int(next(counts)) for _ in range(per_model)) for model in models}

    async def in_flight(self) -> dict[str, int]:
        """Model -> attempts running now."""
        ids = await self._r.zrange(keys.RUNNING, 0, -1)
        if not ids:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for cid in ids:
                pipe.hget(keys.job(as_text(cid)), JobField.MODEL)
            models = await pipe.execute()
        out: dict[str, int] = {}
        for model in models:
            if model is not None:
                out[as_text(model)] = out.get(as_text(model), 0) + 1
        return out

    async def counters(self) -> dict[str, int]:
        """The cluster-wide counters (contract.keys.STATS)."""
        return {as_text(k): int(v) for k, v in (await self._r.hgetall(keys.STATS)).items()}
