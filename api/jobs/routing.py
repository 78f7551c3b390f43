"""Cache-aware routing. A new job goes to the worker whose slots hold the longest prefix of
its prompt. It goes there only where that worker will take it soon. Otherwise it goes to the
model's shared queue.

Workers pull jobs, so routing is choosing a queue. Each worker has a routed queue per
interactive tier. It takes from that queue before the tier's shared queue
(worker/intake/rqworker.py). A worker announces the prompt prefixes its slots hold, and how
busy it is. The prefixes are contract/prefixes.py digests, kept alive by its announcements.
A dead or silent worker's prefixes go with it. At submit the API looks at every live worker
of the model, in one round trip. For each, it reads the deepest of the job's prefixes it
holds and its slots. It also reads the slots in use and the jobs already routed to it.

The policy weighs the cache against the load, as SGLang's router does:
- No routing when the pool is imbalanced. A worker's load is its slots in use plus the jobs
  routed to it. The pool is imbalanced when the busiest load exceeds the idlest by more than
  ROUTE_BALANCE_ABS. It must also be over ROUTE_BALANCE_REL times the idlest. A popular
  prefix (a shared system prompt) then spreads over the pool.
- No routing for a short match. A match must cover ROUTE_MIN_CHARS characters of prompt. A
  shorter one saves a prefill not worth a wait.
- No routing to a full worker while another has a free slot. A full worker's slots are all
  taken (or promised).
- Else the holder of the longest match. Among equals, the least loaded one.

A routed job carries a deadline (`keys.routed`). It is ROUTE_WAIT_SECONDS if its worker has
a free slot. Each job already routed to the worker adds that much again, and so does a full
worker. The deadline is at most four times ROUTE_WAIT_SECONDS. The reaper's tick moves every
job past its deadline back to its tier's shared queue. It moves the jobs of a worker found
dead at once. A job goes back where its arrival puts it (`contract.lua.queues.FALL_BACK`).
That is never ahead of another key's earlier job, so a key cannot jump the queue by routing.
A job is either taken by its worker or moved, never both. Continuations, suspects and batch
lines are never routed. They wait in the shared queues, as they always did. Nor is a key's
job routed while ROUTED_JOBS_PER_KEY of its jobs wait routed. So a key cannot fill the
workers' routed queues with its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis.asyncio as aredis
from redis.exceptions import ResponseError

from api.http import tracing
from api.jobs.workers import WorkerLoad, WorkerRegistry
from api.pool_settings import Routing
from contract import keys, stats, tiers
from contract.entries import as_text
from contract.jobspec import JobSpec
from contract.lua import queues
from contract.prefixes import prefixes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """Where a new job is sent. It names the worker holding its prompt's prefix, and by when
    that worker must take it. Else the job falls back to the shared queue."""

    worker: str
    # of the prompt, in the prefixes the worker holds
    matched_chars: int
    deadline_ms: int


@dataclass(frozen=True)
class Candidate:
    name: str
    # characters of prompt its deepest held prefix covers
    matched: int
    slots: int
    in_use: int
    # jobs routed to it, not yet taken
    routed: int

    @property
    def load(self) -> int:
        return self.in_use + self.routed


def choose(candidates: list[Candidate], settings: Routing) -> Candidate | None:
    """The worker to route to, or None for the shared queue (the policy above)."""
    if len(candidates) < 2:
        # one worker: the shared queue is its own
        return None
    loads = [c.load for c in candidates]
    if max(loads) - min(loads) > settings.balance_abs and max(loads) > settings.balance_rel * min(loads):
        return None
    best = max(candidates, key=lambda c: (c.matched, -c.load))
    if best.matched < settings.min_chars:
        return None
    if best.load >= best.slots and any(c.load < c.slots for c in candidates):
        # not behind a full worker while another has a free slot
        return None
    return best


def wait_ms(holder: Candidate, settings: Routing) -> int:
    """How long the holder has to take the job. A free slot takes it at once. Each job ahead
    of it adds as much again, up to four times. A job ahead is one routed there already, or
    a slot to free."""
    ahead = holder.routed + (1 if holder.in_use + holder.routed >= holder.slots else 0)
    return int(settings.wait_s * 1000 * min(1 + ahead, 4))


class Router:
    def __init__(self, client: aredis.Redis, registry: WorkerRegistry, settings: Routing) -> None:
        self._r = client
        self._registry = registry
        self.settings = settings
        self._fall_back = client.register_script(queues.FALL_BACK)
        self._for_owner = client.register_script(queues.ROUTE_FOR_OWNER)

    async def route(self, spec: JobSpec, owner: str = "") -> Assignment | None:
        """Where a new job of `owner` should wait (None: the shared queue), and until when.
        Enqueueing writes both (contract/queueing.py). A server may refuse the commands,
        under an ACL from before routing. Then every job goes to the shared queue, with a
        warning."""
        route = await self._chosen(spec, owner)
        # the request's span says so
        tracing.current().note(routed=route is not None)
        return route

    async def _chosen(self, spec: JobSpec, owner: str) -> Assignment | None:
        if not self.settings.enabled or spec.priority not in tiers.ROUTED_TIERS:
            return None
        try:
            route = await self._route(spec)
            if route is None or not owner or not self.settings.per_key:
                return route
            member = tiers.routed_member(keys.rq_job_id(spec.id, 0), route.worker, spec.priority)
            longest_ms = int(self.settings.wait_s * 4000) + 60_000
            counted = await self._for_owner(
                keys=[keys.owned(owner, keys.OwnerIndex.ROUTED), keys.routed(spec.model)],
                args=[member, self.settings.per_key, longest_ms],
            )
            return route if counted else None
        except ResponseError as exc:
            log.warning("cache-aware routing is off for this job: %s", exc)
            return None

    async def _route(self, spec: JobSpec) -> Assignment | None:
        found = prefixes(spec)
        if not found:
            return None
        names = await self._registry.live_workers(spec.model)
        if len(names) < 2:
            return None
        digests = [d for d, _ in found]
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.worker_slots(spec.model), names)
            pipe.hmget(keys.worker_load(spec.model), names)
            for name in names:
                pipe.smismember(keys.held_prefixes(name), digests)
                pipe.llen(keys.rq_queue_key(tiers.routed_queue_name(spec.model, spec.priority, name)))
            slots, loads, *rows = await pipe.execute()
        candidates = []
        for i, name in enumerate(names):
            held, routed = rows[2 * i], rows[2 * i + 1]
            matched = max((chars for (_, chars), h in zip(found, held, strict=True) if h), default=0)
            load = WorkerLoad.parse(name, int(slots[i] or 1), as_text(loads[i]) if loads[i] else "")
            candidates.append(Candidate(name, matched, load.slots, load.in_use, int(routed)))
        holder = choose(candidates, self.settings)
        if holder is None:
            return None
        deadline_ms = int(time.time() * 1000) + wait_ms(holder, self.settings)
        return Assignment(holder.name, holder.matched, deadline_ms)

    async def fall_back(self, model: str, worker: str | None = None) -> int:
        """Move the routed jobs past their deadline back to their tier's shared queue. With
        `worker` (found dead), move every one of its jobs. Returns how many went back."""
        index = keys.routed(model)
        if worker is None:
            members = await self._r.zrangebyscore(index, "-inf", int(time.time() * 1000), start=0, num=256)
        else:
            members = [
                m
                for m in await self._r.zrange(index, 0, -1)
                if tiers.parse_routed_member(as_text(m))[1] == worker
            ]
        back = 0
        for raw in members:
            job_id, owner, tier = tiers.parse_routed_member(as_text(raw))
            back += await self._fall_back(
                keys=[
                    keys.rq_queue_key(tiers.routed_queue_name(model, tier, owner)),
                    keys.rq_queue_key(tiers.queue_name(model, tier)),
                    keys.wake(model),
                    index,
                    keys.STATS,
                ],
                args=[job_id, as_text(raw), stats.StatField.route_fallbacks(model), keys.rq_job("")],
            )
        return back
