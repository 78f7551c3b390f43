"""Whether a requeued job may go on waiting past its resume deadline.

A worker's death requeues every job it held, up to its 32 slots. In a storm of crashes, the
pool reads them all again far slower than `RESUME_WAIT_SECONDS` allows. A fixed deadline
failed jobs (`worker_lost`) while live workers were working through them. So the deadline is
a checkpoint, not a verdict. A requeued job past it waits on, `RESUME_WAIT_SECONDS` at a time.

It waits while a live worker serves its model, and the pool is either not full or still
stepping. A live worker announces itself, and its named connections are open. A killed one's
close at once. A pool that is not full has a free slot to take the job. A pool still stepping
has moved the model's `batch:steps` counter since the last checkpoint. Each worker's
announcement adds to that counter. The job also waits while a worker for its model is
starting. That worker's named connection is open. It says so every few seconds while it
fetches, loads and warms the model (worker/intake/presence.py). The storm that kills the warm
workers leaves their replacements loading, and their jobs wait for them. A pool with no live
or starting worker fails the job as before. So does a pool whose every worker is full and
stuck.
"""

from __future__ import annotations

import time

import redis.asyncio as aredis

from api.jobs.workers import WorkerRegistry
from contract import keys, stats


class Resumes:
    def __init__(self, client: aredis.Redis, registry: WorkerRegistry, resume_wait_s: float) -> None:
        # the queues server: the registry and STATS
        self._r = client
        self._registry = registry
        self._wait_s = resume_wait_s
        # model -> (steps, when they last moved)
        self._steps: dict[str, tuple[int, float]] = {}

    async def may_wait(self, model: str) -> bool:
        """True while the pool can still run a requeued job of `model`."""
        connected = {
            c.get("name", "")[len(keys.WORKER_CONNECTION_PREFIX) :]
            for c in await self._r.client_list()
            if c.get("name", "").startswith(keys.WORKER_CONNECTION_PREFIX)
        }
        workers = [w for w in (await self._registry.loads([model])).get(model, []) if w.name in connected]
        if any(w.in_use < w.slots for w in workers):
            return True
        if any(name in connected for name in await self._registry.starting(model)):
            # a worker loading the model will have free slots
            return True
        if not workers:
            return False
        steps = int(await self._r.hget(keys.STATS, stats.StatField.batch("steps", model)) or 0)
        now = time.monotonic()
        seen = self._steps.get(model)
        if seen is None or seen[0] != steps:
            self._steps[model] = (steps, now)
            return True
        return now - seen[1] < self._wait_s
