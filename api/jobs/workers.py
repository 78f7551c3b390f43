"""The worker registry as the API reads it. It says which workers announced which model
recently, and how many jobs they can run at once. `worker.intake.presence` writes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aredis

from api.jobs.owners import now_ms
from contract import keys
from contract.entries import as_text


@dataclass(frozen=True)
class WorkerLoad:
    """One live worker as it last announced itself."""

    name: str
    slots: int
    in_use: int = 0
    step_ms: float = 0.0
    # since it started
    prompt_tokens: int = 0
    # of them, held by a slot's cache already (or restored from host memory)
    cached_tokens: int = 0
    # the KV states its host tier keeps now (worker/engine/cache/)
    host_bytes: int = 0

    @classmethod
    def parse(cls, name: str, slots: int, load: str) -> WorkerLoad:
        parts = load.split()
        # a worker of before the host tier says four
        if len(parts) not in (4, 5):
            return cls(name, slots)
        host = int(parts[4]) if len(parts) == 5 else 0
        return cls(name, slots, int(parts[0]), float(parts[1]), int(parts[2]), int(parts[3]), host)


class WorkerRegistry:
    def __init__(self, client: aredis.Redis, stale_s: float) -> None:
        self._r = client
        self._stale_ms = int(stale_s * 1000)

    async def live_models(self, models: Sequence[str] | None = None) -> dict[str, int]:
        """Model -> number of workers that announced it recently (models with none left out)."""
        if models is None:
            models = sorted(as_text(m) for m in await self._r.smembers(keys.MODELS))
        since = now_ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zcount(keys.workers(model), since, "+inf")
            counts = await pipe.execute()
        return {m: int(c) for m, c in zip(models, counts, strict=True) if c}

    def count_live(self, pipe: aredis.client.Pipeline, model: str) -> None:
        """Add "how many live workers serve `model`" to a caller's pipeline."""
        pipe.zcount(keys.workers(model), now_ms() - self._stale_ms, "+inf")

    def contexts(self, pipe: aredis.client.Pipeline, model: str) -> None:
        """Add "the context per job of each worker of `model`" to a caller's pipeline.
        Silent workers are dropped with their announcements, so these are recent. The last
        one announced comes with them (`keys.LAST_CONTEXT`). It stays when the model has no
        worker."""
        pipe.hvals(keys.context(model))

    def overheads(self, pipe: aredis.client.Pipeline, model: str) -> None:
        """Add "what each worker of `model` says its chat template adds to a prompt" to a
        caller's pipeline (contract/prefixes.py). The last one announced comes with them."""
        pipe.hvals(keys.prompt_overhead(model))

    def visions(self, pipe: aredis.client.Pipeline, model: str) -> None:
        """Add "the most tokens an image becomes on each worker of `model` that reads images"."""
        pipe.hvals(keys.worker_vision(model))

    async def slots(self, models: Sequence[str]) -> dict[str, int]:
        """Model -> jobs its live workers can run at once: their announced SLOTS, summed."""
        live = await self._announced(models, keys.worker_slots)
        total = {m: sum(int(c) for c in counts if c) for m, counts in live}
        return {m: total.get(m, 0) for m in models}

    async def starting(self, model: str) -> list[str]:
        """The workers that said recently they are starting for `model` (not yet serving it)."""
        return await self._recent(keys.starting_workers(model))

    async def live_workers(self, model: str) -> list[str]:
        """The workers of `model` that announced themselves recently."""
        return await self._recent(keys.workers(model))

    async def _recent(self, key: str) -> list[str]:
        """The names in a zset of announcements (name -> ms) made within WORKER_STALE_SECONDS."""
        return [as_text(n) for n in await self._r.zrangebyscore(key, now_ms() - self._stale_ms, "+inf")]

    async def loads(self, models: Sequence[str]) -> dict[str, list[WorkerLoad]]:
        """Model -> how busy each live worker is (its last announcement: worker/intake/presence.py)."""
        since = now_ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrangebyscore(keys.workers(model), since, "+inf")
            live = await pipe.execute()
        served = [(m, [as_text(n) for n in names]) for m, names in zip(models, live, strict=True) if names]
        async with self._r.pipeline(transaction=False) as pipe:
            for model, names in served:
                pipe.hmget(keys.worker_slots(model), names)
                pipe.hmget(keys.worker_load(model), names)
            rows = await pipe.execute() if served else []
        out: dict[str, list[WorkerLoad]] = {}
        for i, (model, names) in enumerate(served):
            slots, loads = rows[2 * i], rows[2 * i + 1]
            out[model] = [
                WorkerLoad.parse(name, int(s or 0), as_text(load) if load else "")
                for name, s, load in zip(names, slots, loads, strict=True)
            ]
        return out

    async def placements(self, models: Sequence[str]) -> dict[str, list[tuple[int, int]]]:
        """Model -> (layers offloaded to the GPU, KV cache bytes) of each live worker that
        announced them. Workers announce them from worker/engine/devices.py."""
        live = await self._announced(models, keys.worker_placement)
        out: dict[str, list[tuple[int, int]]] = {}
        for model, values in live:
            pairs = [as_text(v).split() for v in values if v]
            out[model] = [(int(layers), int(kv)) for layers, kv in pairs]
        return out

    async def _announced(
        self, models: Sequence[str], hash_of: Callable[[str], str]
    ) -> list[tuple[str, list]]:
        """(model, what each of its live workers announced in the hash `hash_of(model)`).
        There is one pair for each model that has a live worker."""
        since = now_ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrangebyscore(keys.workers(model), since, "+inf")
            live = await pipe.execute()
        served = [(m, names) for m, names in zip(models, live, strict=True) if names]
        async with self._r.pipeline(transaction=False) as pipe:
            for model, names in served:
                pipe.hmget(hash_of(model), names)
            values = await pipe.execute() if served else []
        return [(m, vs) for (m, _), vs in zip(served, values, strict=True)]

    async def names(self) -> list[str]:
        """Every registered worker of every model, live or silent (until forgotten)."""
        return [name for names in (await self.by_model()).values() for name in names]

    async def by_model(self) -> dict[str, list[str]]:
        """Model -> its registered workers, live or silent (until forgotten)."""
        models = [as_text(m) for m in await self._r.smembers(keys.MODELS)]
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrange(keys.workers(model), 0, -1)
            rows = await pipe.execute() if models else []
        return {m: [as_text(n) for n in names] for m, names in zip(models, rows, strict=True)}

    async def forget_silent(self) -> None:
        """Drop the workers that stopped announcing, so their entries do not pile up. A
        killed worker never says goodbye. One that comes back announces itself again."""
        models = [as_text(m) for m in await self._r.smembers(keys.MODELS)]
        before = now_ms() - self._stale_ms
        async with self._r.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.zrangebyscore(keys.workers(model), "-inf", f"({before}")
            silent = await pipe.execute()
        async with self._r.pipeline(transaction=False) as pipe:
            for model, names in zip(models, silent, strict=True):
                if names:
                    # by score, not by name: an announcement made meanwhile stays (its
                    # slots come back with the next one)
                    pipe.zremrangebyscore(keys.workers(model), "-inf", f"({before}")
                    pipe.hdel(keys.worker_slots(model), *names)
                    pipe.hdel(keys.context(model), *names)
                    pipe.hdel(keys.prompt_overhead(model), *names)
                    pipe.hdel(keys.worker_placement(model), *names)
                    pipe.hdel(keys.worker_vision(model), *names)
                    pipe.hdel(keys.worker_load(model), *names)
            await pipe.execute()
